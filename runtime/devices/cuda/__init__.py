"""CUDA device on the CUDA driver API through cuda-bindings (device.py, driver.py)."""
