"""Stand-in for vllm/device_allocator/cumem.py: the singleton and the
per-allocation record whose cpu_backup_tensor holds the weights while the
allocator sleeps (the rest of sleep/wake_up needs CUDA)."""


class AllocationData:
    def __init__(self, handle, tag):
        self.handle, self.tag, self.cpu_backup_tensor = handle, tag, None


class CuMemAllocator:
    instance = None

    @staticmethod
    def get_instance():
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self):
        self.pointer_to_data = {}

    def sleep(self, offload_tags=None):
        for data in self.pointer_to_data.values():
            data.cpu_backup_tensor = b"offloaded"

    def wake_up(self, tags=None):
        for data in self.pointer_to_data.values():
            data.cpu_backup_tensor = None
