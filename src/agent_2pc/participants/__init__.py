"""Participants: one module per kind of change; each prepares (votes), applies and redoes."""
