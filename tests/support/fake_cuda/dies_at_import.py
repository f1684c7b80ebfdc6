"""Kills the process importing it (a segfaulting extension)."""

import os
import signal

os.kill(os.getpid(), signal.SIGKILL)
