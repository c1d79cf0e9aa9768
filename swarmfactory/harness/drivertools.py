"""Building the candidate driver (driver.c) and naming system calls on this machine.

The driver is compiled once per compiler and source into the build cache, with portable flags
(it runs no SIMD itself). System-call numbers differ between architectures, so their names come
from this machine's own headers, compiled once and cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from functools import cache
from pathlib import Path

from swarmfactory import lifecycle

DRIVER_SOURCE = Path(__file__).with_name("driver.c")

_SYSCALL_NAMES = """read write open close stat fstat lstat poll lseek mmap mprotect munmap brk
rt_sigaction rt_sigprocmask ioctl pread64 pwrite64 readv writev access pipe pipe2 select sched_yield
mremap msync mincore madvise shmget shmat dup dup2 dup3 pause nanosleep getitimer alarm setitimer
getpid sendfile socket connect accept accept4 sendto recvfrom sendmsg recvmsg shutdown bind listen
socketpair clone clone3 fork vfork execve execveat exit wait4 waitid kill tkill tgkill uname fcntl
flock fsync truncate ftruncate getdents getdents64 getcwd chdir fchdir rename renameat renameat2
mkdir mkdirat rmdir creat link linkat unlink unlinkat symlink readlink readlinkat chmod fchmod
chown ptrace getuid syslog setuid setgid setsid setpgid getppid prctl arch_prctl setrlimit
prlimit64 mount umount2 reboot sethostname init_module delete_module gettid futex
sched_setaffinity sched_getaffinity set_tid_address exit_group epoll_create epoll_create1
epoll_ctl epoll_wait openat newfstatat statx unshare setns process_vm_readv process_vm_writev
perf_event_open memfd_create bpf seccomp io_uring_setup io_uring_enter pidfd_open pidfd_send_signal
pidfd_getfd userfaultfd timer_create signalfd signalfd4 eventfd eventfd2 inotify_init1 mknod
mknodat sysinfo times personality sigaltstack rt_sigreturn rt_sigqueueinfo rt_tgsigqueueinfo
getrandom clock_gettime clock_nanosleep gettimeofday restart_syscall keyctl add_key request_key
kexec_load kcmp open_by_handle_at name_to_handle_at fanotify_init move_pages migrate_pages mbind
set_mempolicy vmsplice splice tee process_madvise landlock_create_ruleset openat2 faccessat
faccessat2 fchmodat fchownat utimensat setpriority getpriority sched_setscheduler sched_setparam
sched_getscheduler sched_getparam sched_setattr sched_getattr ioprio_set ioprio_get getppid getpgid
getsid getpgrp setregid setresuid setresgid setgroups capset capget chroot pivot_root quotactl
acct swapon swapoff iopl ioperm modify_ldt mlock munlock mlockall munlockall membarrier rseq
set_robust_list get_robust_list close_range dup2 fadvise64 readahead fallocate copy_file_range
sendmmsg recvmmsg getsockopt setsockopt getsockname getpeername alarm kcmp lookup_dcookie
open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr""".split()



_BUILD_LOCK = threading.Lock()
# position independent, bound at once and with its GOT read-only from the start (full RELRO):
# nothing of the driver that decides what runs is writable when the candidate's library loads
DRIVER_FLAGS = ("-O2", "-fopenmp", "-fPIE", "-pie", "-Wl,-z,relro", "-Wl,-z,now", "-Wl,-z,noexecstack")


def _cache_dir() -> Path:
    from swarmfactory.backends.c import cache_dir

    return cache_dir()


@cache
def _driver_key_parts() -> tuple[str, str, str]:
    from swarmfactory.backends.c import CBackend

    cc = CBackend()
    return DRIVER_SOURCE.read_text(), cc.cc, cc.versions()["cc_version"]


def driver_path() -> str:
    """The driver, compiled once per compiler and source (portable flags: it runs no SIMD)."""
    src, cc_path, cc_version = _driver_key_parts()
    key = hashlib.sha256((src + cc_version + " ".join(DRIVER_FLAGS)).encode()).hexdigest()[:16]
    out = _cache_dir() / f"sf-driver-{key}"
    if out.exists():  # checked every time: a cleared build cache must not leave a stale path
        return str(out)
    with _BUILD_LOCK:
        if not out.exists():
            tmp = out.with_suffix(f".tmp{os.getpid()}")
            proc = subprocess.run([cc_path, *DRIVER_FLAGS, "-o", str(tmp), str(DRIVER_SOURCE),
                                   "-Wl,--no-as-needed", "-lm", "-ldl"],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"cannot build the candidate driver: {proc.stderr[-2000:]}")
            os.replace(tmp, out)
    return str(out)


@cache
def syscall_names() -> dict[int, str]:
    """This machine's system-call numbers, from its own headers (so right on any architecture)."""
    from swarmfactory.backends.c import CBackend

    lines = "\n".join(f'#ifdef SYS_{n}\nprintf("%d {n}\\n", (int)SYS_{n});\n#endif' for n in _SYSCALL_NAMES)
    src = f"#include <stdio.h>\n#include <sys/syscall.h>\nint main(void) {{\n{lines}\nreturn 0;}}\n"
    out = _cache_dir() / f"sf-syscalls-{hashlib.sha256(src.encode()).hexdigest()[:12]}.json"
    if out.exists():
        return {int(k): v for k, v in json.loads(out.read_text()).items()}
    names: dict[int, str] = {}
    with lifecycle.temp_dir_for("sf-sys-") as tmp:
        c, exe = Path(tmp) / "s.c", Path(tmp) / "s"
        c.write_text(src)
        if subprocess.run([CBackend().cc, "-o", str(exe), str(c)], capture_output=True).returncode == 0:
            for line in subprocess.run([str(exe)], capture_output=True, text=True).stdout.splitlines():
                nr, name = line.split()
                names.setdefault(int(nr), name)
    tmp_out = out.with_suffix(f".tmp{os.getpid()}")
    tmp_out.write_text(json.dumps(names))
    os.replace(tmp_out, out)
    return names


