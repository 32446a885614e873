"""engine/backends"""
