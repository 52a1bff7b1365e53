"""Capacity planning before deployment: StreamBed's MST search, scaling models and resource explorer."""
