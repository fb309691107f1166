"""AMDGPU device on HIP through hip-python (device.py, driver.py)."""
