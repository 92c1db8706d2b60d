"""The figures that bound a shared-memory window (nnabla_mpt.distributed.memory_room),
read from files laid out as the kernel lays out /proc and the cgroup file systems, and
from this machine's own."""
import os

import pytest

from nnabla_mpt.distributed import memory_room
from nnabla_mpt.distributed.memory_room import MemoryRoom

MIB = 2 ** 20


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path, cgroup, available_kib=8 * 1024 ** 2):
    proc = tmp_path / "proc"
    _write(proc / "meminfo", f"MemTotal:       16000000 kB\nMemFree:         1000 kB\n"
                             f"MemAvailable:   {available_kib} kB\nBuffers: 0 kB\n")
    _write(proc / "self" / "cgroup", cgroup)
    return str(proc)


def _read(tmp_path, proc):
    return memory_room.read(shm_dir=str(tmp_path), proc=proc,
                            cgroup_root=str(tmp_path / "cgroup"))


def test_mem_available_bounds_the_memory_where_no_cgroup_limits_it(tmp_path):
    proc = _proc(tmp_path, "0::/job\n")
    _write(tmp_path / "cgroup" / "cgroup.controllers", "cpu memory\n")
    _write(tmp_path / "cgroup" / "job" / "memory.max", "max\n")
    room = _read(tmp_path, proc)
    assert room.memory == 8 * 1024 ** 3 and room.memory_source == "MemAvailable"
    st = os.statvfs(tmp_path)
    assert room.shm_free == st.f_bavail * st.f_frsize


def test_a_cgroup_v2_limit_leaves_its_limit_minus_the_usage_without_inactive_files(tmp_path):
    proc = _proc(tmp_path, "0::/job/step\n")
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "job" / "step" / "memory.max", "max\n")
    _write(root / "job" / "memory.max", f"{3072 * MIB}\n")
    _write(root / "job" / "memory.current", f"{1500 * MIB}\n")
    _write(root / "job" / "memory.stat", f"anon 1\nfile 9\ninactive_file {428 * MIB}\n")
    room = _read(tmp_path, proc)
    assert room.memory == (3072 - 1500 + 428) * MIB  # the ancestor's limit applies
    assert room.memory_source == "the cgroup's memory limit"


def test_the_tightest_cgroup_v1_level_applies(tmp_path):
    proc = _proc(tmp_path, "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n")
    mem = tmp_path / "cgroup" / "memory"
    for folder, limit, usage in ((mem, 2 ** 63 - 4096, 7000 * MIB),
                                 (mem / "docker", 6000 * MIB, 2000 * MIB),
                                 (mem / "docker" / "abc", 3000 * MIB, 1000 * MIB)):
        _write(folder / "memory.limit_in_bytes", f"{limit}\n")
        _write(folder / "memory.usage_in_bytes", f"{usage}\n")
    _write(mem / "docker" / "abc" / "memory.stat", f"total_inactive_file {100 * MIB}\n")
    room = _read(tmp_path, proc)
    assert room.memory == (3000 - 1000 + 100) * MIB
    # a limit that leaves more than MemAvailable does not count
    room = _read(tmp_path, _proc(tmp_path, "4:memory:/docker/abc\n", available_kib=1024 ** 2))
    assert (room.memory, room.memory_source) == (1024 ** 3, "MemAvailable")


def test_a_namespaced_cgroup_path_falls_back_to_the_mount_root(tmp_path):
    """In a container the path in /proc/self/cgroup may not exist under the mount; the
    root's files then describe the container's own cgroup."""
    proc = _proc(tmp_path, "4:memory:/host/path/of/the/container\n")
    mem = tmp_path / "cgroup" / "memory"
    _write(mem / "memory.limit_in_bytes", f"{2048 * MIB}\n")
    _write(mem / "memory.usage_in_bytes", f"{2048 * MIB + 5}\n")
    room = _read(tmp_path, proc)
    assert room.memory == 0  # used up: nothing left, never negative


def test_figures_that_cannot_be_read_are_none(tmp_path):
    room = memory_room.read(shm_dir=str(tmp_path / "missing"), proc=str(tmp_path / "none"),
                            cgroup_root=str(tmp_path / "none"))
    assert room == MemoryRoom(None, None, "MemAvailable")
    assert room.allowed() is None and room.fits(2 ** 60)
    assert "cannot be read" in room.describe()


def test_a_window_may_take_the_free_shm_and_half_of_the_memory():
    room = MemoryRoom(shm_free=100 * MIB, memory=300 * MIB)
    assert room.allowed() == 100 * MIB
    assert room.fits(100 * MIB) and not room.fits(100 * MIB + 1)
    room = MemoryRoom(shm_free=1000 * MIB, memory=300 * MIB)
    assert room.allowed() == 150 * MIB
    assert room.fits(150 * MIB) and not room.fits(150 * MIB + 1)
    assert MemoryRoom(None, 300 * MIB).allowed() == 150 * MIB
    assert MemoryRoom(100 * MIB, None).allowed() == 100 * MIB
    text = room.describe()
    for fact in ("/dev/shm has 1,000.0 MiB free", "300.0 MiB more memory (MemAvailable)",
                 "at most half"):
        assert fact in text, text


def test_this_machine_tells_both_figures():
    room = memory_room.read()
    if not os.path.isdir("/dev/shm") or not os.path.exists("/proc/meminfo"):
        pytest.skip("this machine has no /dev/shm or /proc/meminfo")
    assert room.shm_free is not None and room.shm_free >= 0
    assert room.memory is not None and 0 < room.memory
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert room.memory <= total
