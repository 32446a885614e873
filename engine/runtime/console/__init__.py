"""What a person at a terminal sees and sends: whether stdout is a terminal (`terminal`),
progress bars or lines (`progress`), and SIGINT/SIGTERM ending a session alike (`interrupts`).
"""
