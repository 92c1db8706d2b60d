"""What the benchmarks print about the machine they ran on."""
import platform


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
