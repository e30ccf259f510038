"""A device's stored measurements as plain records, and the hardware profile and calibration
they make for the time model.
"""
