"""engine/pools"""
