"""trainers/tasks"""
