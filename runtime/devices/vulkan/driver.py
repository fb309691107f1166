"""The Vulkan driver side: the `vulkan` binding, the instance, the physical device and what it
offers, the logical device with its one compute queue.

Everything here goes through the `vulkan` pip package (cffi, ABI mode); its `ffi` and `lib`
are used directly where the package's wrappers would allocate per call or hide pNext chains.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from ...contract.errors import QdcError
from ...device import DeviceCapabilities

INSTALL_HINT = "pip install vulkan; apt-get install mesa-vulkan-drivers libvulkan1"
API_VERSION_1_2 = (1 << 22) | (2 << 12)
VENDOR_NVIDIA = 0x10DE
# Workgroup size for launch policies that leave it to the device (block_dim 0): 256 on NVIDIA
# (2711 GB/s on an H100 saxpy), and 256 elsewhere: on lavapipe bench/bench_vulkan.py
# measured saxpy 2^22 f32 at 1.5/1.8/2.1/2.2/2.2/1.8 GB/s for 32..1024 (128-512 within noise).
DEFAULT_BLOCK_DIM = {VENDOR_NVIDIA: 256}
FALLBACK_BLOCK_DIM = 256
ATOMIC_FLOAT_EXTENSION = b"VK_EXT_shader_atomic_float"
SM_BUILTINS_EXTENSION = b"VK_NV_shader_sm_builtins"  # how many multiprocessors (NVIDIA)


class VulkanUnavailableError(QdcError, RuntimeError):
    """No usable Vulkan: the binding, the loader or a compute-capable device is missing."""


def load_binding():
    """The `vulkan` module; VulkanUnavailableError saying what to install when the package or
    the loader library (libvulkan.so.1) is missing."""
    try:
        import vulkan
    except ImportError:
        raise VulkanUnavailableError(f"the vulkan device needs the `vulkan` Python package: {INSTALL_HINT}") from None
    except OSError as e:  # the package is there, the loader is not
        raise VulkanUnavailableError(f"the `vulkan` package cannot find the Vulkan loader (libvulkan.so.1: {e}): "
                                     f"{INSTALL_HINT}") from None
    return vulkan


@dataclass(frozen=True)
class VulkanCapabilities(DeviceCapabilities):
    """What the physical device offers, as the SPIR-V target and the loader ask it."""
    name: str = ""
    vendor_id: int = 0
    api_version: tuple = (0, 0, 0)
    int64: bool = False
    float64: bool = False
    int16: bool = False
    int8: bool = False
    float16: bool = False
    storage_8bit: bool = False
    storage_16bit: bool = False
    int64_atomics: bool = False
    atomic_float32_add: bool = False
    atomic_float64_add: bool = False
    max_workgroup_count: tuple = (65535, 65535, 65535)
    max_workgroup_size: tuple = (128, 1, 1)
    max_workgroup_invocations: int = 128
    max_storage_buffer_range: int = 1 << 27
    min_storage_buffer_offset_alignment: int = 256
    max_bound_storage_buffers: int = 4  # maxPerStageDescriptorStorageBuffers (Vulkan's minimum: 4)
    buffer_device_address: bool = False  # bufferDeviceAddress: tasks with many arrays reach them by address
    subgroup_size: int = 1
    subgroup_basic: bool = False
    subgroup_arithmetic: bool = False
    subgroup_vote: bool = False
    subgroup_ballot: bool = False
    subgroup_shuffle: bool = False
    subgroup_shuffle_relative: bool = False
    ieee_preserve: bool = False  # SignedZeroInfNanPreserve for f32 (and f64 where it has Float64)
    default_block_dim: int = FALLBACK_BLOCK_DIM
    # Invocations the device runs at once (multiprocessors x warps each x 32, from
    # VK_NV_shader_sm_builtins); 0 where the driver does not say.
    resident_invocations: int = 0
    cpu_device: bool = False  # VK_PHYSICAL_DEVICE_TYPE_CPU (lavapipe): its invocations run on the host's cores
    # Loop iterations after which the driver silently stops a shader invocation, 0 for none:
    # llvmpipe's (lavapipe's) gallivm counts every loop's iterations of an invocation against
    # LP_MAX_TGSI_LOOP_ITERATIONS. Serial range-fors are dispatched in chunks below it.
    loop_iteration_limit: int = 0


LLVMPIPE_LOOP_LIMIT = 65535  # gallivm's LP_MAX_TGSI_LOOP_ITERATIONS


def check(vk, result: int, what: str) -> None:
    if result != vk.VK_SUCCESS:
        raise VulkanUnavailableError(f"vulkan: {what} failed (VkResult {result})")


# Vulkan objects this process holds, counted where they are created and destroyed: every device
# has exactly one owner (its VulkanDevice, which destroys it in close() and on every failure
# path of its __init__), and tests read the counts through live_objects() (at most 1 of each).
# The instance is one per process (shared_instance), never destroyed: NVIDIA's driver refuses
# new instances (VK_ERROR_INCOMPATIBLE_DRIVER) and corrupts subgroup builtins after a few dozen
# vkCreateInstance/vkDestroyInstance cycles (Quadrants keeps its VkInstance for the process for
# the same reason), and test suites re-initialise hundreds of times.
_live = {"instances": 0, "devices": 0}
_shared_instance: list = []  # [VkInstance] once created
_instance_lock = threading.Lock()


def live_objects() -> dict:
    """{"instances": n, "devices": n}: those created here and not destroyed yet."""
    return dict(_live)


def create_instance(vk):
    ffi, lib = vk.ffi, vk.lib
    keep = [ffi.new("char[]", b"qdc")]
    app = ffi.new("VkApplicationInfo*", {"sType": vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, "pApplicationName": keep[0],
                                         "pEngineName": keep[0], "apiVersion": API_VERSION_1_2})
    info = ffi.new("VkInstanceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                             "pApplicationInfo": app})
    out = ffi.new("VkInstance*")
    result = lib.vkCreateInstance(info, ffi.NULL, out)
    if result != vk.VK_SUCCESS:
        raise VulkanUnavailableError(f"vulkan: no Vulkan driver (ICD) could create an instance (VkResult {result}): "
                                     f"{INSTALL_HINT}")
    _live["instances"] += 1
    return out[0]


def shared_instance(vk):
    """The process's one VkInstance, created on first use (VulkanUnavailableError when no driver
    can create one; the next call tries again). Callers never destroy it."""
    with _instance_lock:
        if not _shared_instance:
            _shared_instance.append(create_instance(vk))
        return _shared_instance[0]


def physical_devices(vk, instance) -> list:
    ffi, lib = vk.ffi, vk.lib
    count = ffi.new("uint32_t*")
    check(vk, lib.vkEnumeratePhysicalDevices(instance, count, ffi.NULL), "vkEnumeratePhysicalDevices")
    handles = ffi.new("VkPhysicalDevice[]", count[0])
    check(vk, lib.vkEnumeratePhysicalDevices(instance, count, handles), "vkEnumeratePhysicalDevices")
    return [handles[i] for i in range(count[0])]


def compute_queue_family(vk, physical) -> int | None:
    ffi, lib = vk.ffi, vk.lib
    count = ffi.new("uint32_t*")
    lib.vkGetPhysicalDeviceQueueFamilyProperties(physical, count, ffi.NULL)
    props = ffi.new("VkQueueFamilyProperties[]", count[0])
    lib.vkGetPhysicalDeviceQueueFamilyProperties(physical, count, props)
    families = [i for i in range(count[0]) if props[i].queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
    # A compute family without graphics is the dedicated one on discrete GPUs; else the first.
    dedicated = [i for i in families if not props[i].queueFlags & vk.VK_QUEUE_GRAPHICS_BIT]
    return (dedicated or families or [None])[0]


def select_physical_device(vk, instance, index: int | None = None):
    """(physical device, queue family): the first compute-capable Vulkan 1.2 device, or the
    index-th device when `index` (or QDC_VULKAN_DEVICE) says which."""
    if index is None and os.environ.get("QDC_VULKAN_DEVICE", "").strip():
        text = os.environ["QDC_VULKAN_DEVICE"].strip()
        if not text.isdigit():
            raise ValueError(f"QDC_VULKAN_DEVICE={text!r}: expected a device index (0, 1, ...)")
        index = int(text)
    devices = physical_devices(vk, instance)
    if not devices:
        raise VulkanUnavailableError(f"vulkan: no Vulkan device found (no driver installed?): {INSTALL_HINT}")
    names = [device_name(vk, d) for d in devices]
    if index is not None:
        if not 0 <= index < len(devices):
            raise VulkanUnavailableError(f"vulkan: device {index} asked for (QDC_VULKAN_DEVICE), but there are "
                                         f"{len(devices)}: {', '.join(f'{i}: {n}' for i, n in enumerate(names))}")
        candidates = [index]
    else:
        candidates = range(len(devices))
    for i in candidates:
        family = compute_queue_family(vk, devices[i])
        if family is not None and api_version(vk, devices[i]) >= API_VERSION_1_2:
            return devices[i], family
    raise VulkanUnavailableError(f"vulkan: no device with a compute queue and Vulkan 1.2 among "
                                 f"{', '.join(names)}")


def device_name(vk, physical) -> str:
    props = vk.ffi.new("VkPhysicalDeviceProperties*")
    vk.lib.vkGetPhysicalDeviceProperties(physical, props)
    return vk.ffi.string(props.deviceName).decode(errors="replace")


def api_version(vk, physical) -> int:
    props = vk.ffi.new("VkPhysicalDeviceProperties*")
    vk.lib.vkGetPhysicalDeviceProperties(physical, props)
    return props.apiVersion


def device_extensions(vk, physical) -> set:
    ffi, lib = vk.ffi, vk.lib
    count = ffi.new("uint32_t*")
    check(vk, lib.vkEnumerateDeviceExtensionProperties(physical, ffi.NULL, count, ffi.NULL), "extension query")
    props = ffi.new("VkExtensionProperties[]", count[0])
    check(vk, lib.vkEnumerateDeviceExtensionProperties(physical, ffi.NULL, count, props), "extension query")
    return {ffi.string(props[i].extensionName) for i in range(count[0])}


class FeatureChain:
    """VkPhysicalDeviceFeatures2 with the 1.1, 1.2 and atomic-float structs chained: filled by
    vkGetPhysicalDeviceFeatures2, then passed (as it is) to vkCreateDevice, which enables
    everything the device has."""

    def __init__(self, vk, atomic_float: bool):
        ffi = vk.ffi
        self.atomic = ffi.new("VkPhysicalDeviceShaderAtomicFloatFeaturesEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT}) if atomic_float else None
        self.v12 = ffi.new("VkPhysicalDeviceVulkan12Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
            "pNext": self.atomic if atomic_float else ffi.NULL})
        self.v11 = ffi.new("VkPhysicalDeviceVulkan11Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, "pNext": self.v12})
        self.root = ffi.new("VkPhysicalDeviceFeatures2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": self.v11})

    def query(self, vk, physical) -> "FeatureChain":
        vk.lib.vkGetPhysicalDeviceFeatures2(physical, self.root)
        # Features no kernel uses cost driver time (robustness) or are irrelevant: off.
        self.root.features.robustBufferAccess = 0
        self.v12.bufferDeviceAddressCaptureReplay = 0
        self.v12.bufferDeviceAddressMultiDevice = 0
        return self


def _subgroup_has(vk, v11, operation: int) -> bool:
    """Whether compute shaders may use the subgroup operations of class `operation`."""
    return bool(v11.subgroupSupportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT
                and v11.subgroupSupportedOperations & operation)


def read_capabilities(vk, physical, chain: FeatureChain) -> VulkanCapabilities:
    ffi, lib = vk.ffi, vk.lib
    v12 = ffi.new("VkPhysicalDeviceVulkan12Properties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES})
    v11 = ffi.new("VkPhysicalDeviceVulkan11Properties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES,
                                                          "pNext": v12})
    props2 = ffi.new("VkPhysicalDeviceProperties2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                                      "pNext": v11})
    sm = None
    if SM_BUILTINS_EXTENSION in device_extensions(vk, physical):
        sm = ffi.new("VkPhysicalDeviceShaderSMBuiltinsPropertiesNV*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV, "pNext": v11})
        props2.pNext = sm
    lib.vkGetPhysicalDeviceProperties2(physical, props2)
    p, limits = props2.properties, props2.properties.limits
    f, f11, f12, fa = chain.root.features, chain.v11, chain.v12, chain.atomic
    version = p.apiVersion
    return VulkanCapabilities(
        name=ffi.string(p.deviceName).decode(errors="replace"), vendor_id=p.vendorID,
        api_version=(version >> 22, (version >> 12) & 0x3FF, version & 0xFFF),
        int64=bool(f.shaderInt64), float64=bool(f.shaderFloat64), int16=bool(f.shaderInt16),
        int8=bool(f12.shaderInt8), float16=bool(f12.shaderFloat16),
        storage_8bit=bool(f12.storageBuffer8BitAccess), storage_16bit=bool(f11.storageBuffer16BitAccess),
        int64_atomics=bool(f12.shaderBufferInt64Atomics),
        atomic_float32_add=bool(fa is not None and fa.shaderBufferFloat32AtomicAdd),
        atomic_float64_add=bool(fa is not None and fa.shaderBufferFloat64AtomicAdd),
        max_workgroup_count=tuple(limits.maxComputeWorkGroupCount),
        max_workgroup_size=tuple(limits.maxComputeWorkGroupSize),
        max_workgroup_invocations=limits.maxComputeWorkGroupInvocations,
        max_storage_buffer_range=limits.maxStorageBufferRange,
        min_storage_buffer_offset_alignment=int(limits.minStorageBufferOffsetAlignment),
        max_bound_storage_buffers=int(limits.maxPerStageDescriptorStorageBuffers),
        buffer_device_address=bool(f12.bufferDeviceAddress),
        subgroup_size=v11.subgroupSize,
        subgroup_basic=_subgroup_has(vk, v11, vk.VK_SUBGROUP_FEATURE_BASIC_BIT),
        subgroup_arithmetic=_subgroup_has(vk, v11, vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT),
        subgroup_vote=_subgroup_has(vk, v11, vk.VK_SUBGROUP_FEATURE_VOTE_BIT),
        subgroup_ballot=_subgroup_has(vk, v11, vk.VK_SUBGROUP_FEATURE_BALLOT_BIT),
        subgroup_shuffle=_subgroup_has(vk, v11, vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT),
        subgroup_shuffle_relative=_subgroup_has(vk, v11, vk.VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT),
        ieee_preserve=bool(v12.shaderSignedZeroInfNanPreserveFloat32
                           and (v12.shaderSignedZeroInfNanPreserveFloat64 or not f.shaderFloat64)),
        default_block_dim=min(DEFAULT_BLOCK_DIM.get(p.vendorID, FALLBACK_BLOCK_DIM), limits.maxComputeWorkGroupSize[0]),
        resident_invocations=sm.shaderSMCount * sm.shaderWarpsPerSM * 32 if sm is not None else 0,
        cpu_device=p.deviceType == vk.VK_PHYSICAL_DEVICE_TYPE_CPU,
        loop_iteration_limit=LLVMPIPE_LOOP_LIMIT if ffi.string(p.deviceName).startswith(b"llvmpipe") else 0)


def create_device(vk, physical, family: int, chain: FeatureChain, extensions: list):
    ffi, lib = vk.ffi, vk.lib
    priority = ffi.new("float[]", [1.0])
    queue_info = ffi.new("VkDeviceQueueCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                                      "queueFamilyIndex": family, "queueCount": 1,
                                                      "pQueuePriorities": priority})
    names = [ffi.new("char[]", e) for e in extensions]
    name_array = ffi.new("char*[]", names)
    info = ffi.new("VkDeviceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "pNext": chain.root,
                                           "queueCreateInfoCount": 1, "pQueueCreateInfos": queue_info,
                                           "enabledExtensionCount": len(names),
                                           "ppEnabledExtensionNames": name_array})
    out = ffi.new("VkDevice*")
    check(vk, lib.vkCreateDevice(physical, info, ffi.NULL, out), "vkCreateDevice")
    _live["devices"] += 1
    queue = ffi.new("VkQueue*")
    lib.vkGetDeviceQueue(out[0], family, 0, queue)
    return out[0], queue[0]


def destroy_device(vk, device) -> None:
    vk.lib.vkDestroyDevice(device, vk.ffi.NULL)
    _live["devices"] -= 1


def memory_types(vk, physical) -> list:
    """[(property flags, heap size)] per memory type of the device."""
    props = vk.ffi.new("VkPhysicalDeviceMemoryProperties*")
    vk.lib.vkGetPhysicalDeviceMemoryProperties(physical, props)
    return [(props.memoryTypes[i].propertyFlags, props.memoryHeaps[props.memoryTypes[i].heapIndex].size)
            for i in range(props.memoryTypeCount)]
