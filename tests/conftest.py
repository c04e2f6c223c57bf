"""The tests run Mamba's eager sequential scan on a CPU unless a test asks for another mode:
compiling the fused scan step takes seconds for each new shape. Subprocesses inherit the setting."""
import os

os.environ.setdefault("WINDTUNNEL_SCAN", "sequential")
