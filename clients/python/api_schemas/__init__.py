"""Pydantic request and response models shared by the server and the Python client."""
