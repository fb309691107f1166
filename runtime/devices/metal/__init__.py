"""Metal device on PyObjC's Metal framework wrapper, macOS only (device.py, driver.py)."""
