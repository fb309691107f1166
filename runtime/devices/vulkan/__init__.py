"""The Vulkan device (docs/design.md, Devices and launches): SPIR-V per task, dispatched through the `vulkan`
pip binding (cffi). `VulkanDevice` is in device.py; driver.py finds and opens the device,
pipelines.py builds and launches the tasks, kernels.py holds the ABI's pure parts. Importing
this package needs nothing; creating a device needs the binding and a Vulkan driver."""
