"""Nothing we start outlives us, however we die (swarmfactory/lifecycle.py): checked by process
tree, pid and start time, never by name."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from swarmfactory import lifecycle
from swarmfactory.evidence.processes import ProcessLedger
from swarmfactory.evidence.store import Store

# A parent that starts two trusted workers (a torch import each), freezes one (SIGSTOP, as the
# harness does while another contender is timed), says so, and waits to be killed.
PARENT = textwrap.dedent("""
    import sys, time
    from swarmfactory import lifecycle
    from swarmfactory.evidence.processes import ProcessLedger
    from swarmfactory.evidence.store import Store
    from swarmfactory.harness.sandbox import Worker
    if len(sys.argv) > 1:
        lifecycle.record_in(ProcessLedger(Store(sys.argv[1])))
    a, b = Worker(trusted=True), Worker(trusted=True)
    a.freeze()
    print(a.proc.pid, b.proc.pid, lifecycle.guard_pid(), flush=True)
    time.sleep(600)
""")


def _start_parent(*args):
    proc = subprocess.Popen([sys.executable, "-c", PARENT, *args], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 3 and all(pids), pids
    return proc, pids


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_kill_9_of_the_parent_ends_its_frozen_and_running_workers(process_tree):
    proc, (frozen, running, guard) = _start_parent()
    try:
        assert _state(frozen) == "T"
        tree = process_tree.descendants(proc.pid)
        assert {frozen, running, guard} <= tree
        os.kill(proc.pid, signal.SIGKILL)  # as the OOM killer would: no handler of ours runs
        proc.wait()
        assert process_tree.still_alive(tree, within=10) == set()
    finally:
        proc.kill()


# A parent with a worker's home, a build folder and one replaced by a symbolic link to a folder
# it must not touch; a forked child makes a folder of its own and exits first.
DIRS_PARENT = textwrap.dedent("""
    import os, sys, time
    from swarmfactory import lifecycle
    from swarmfactory.harness.sandbox import Worker
    w = Worker(trusted=True)
    build, swapped = lifecycle.temp_dir("sf-build-"), lifecycle.temp_dir("sf-build-")
    os.rmdir(swapped)
    os.symlink(sys.argv[1], swapped)
    pid = os.fork()
    if pid == 0:
        lifecycle.temp_dir("sf-child-")  # its own guard: it must not take the parent's with it
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.5)
    print(w.tmpdir, build, swapped, int(os.path.isdir(w.tmpdir) and os.path.isdir(build)), flush=True)
    time.sleep(600)
""")


def test_kill_9_of_the_parent_removes_its_temporary_folders_and_nothing_through_a_link(tmp_path, process_tree):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    proc = subprocess.Popen([sys.executable, "-c", DIRS_PARENT, str(keep)], stdout=subprocess.PIPE, text=True)
    try:
        home, build, swapped, alive = proc.stdout.readline().split()
        assert alive == "1", "a forked child's exit removed its parent's folders"
        tree = process_tree.descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # no handler, no finally of ours runs
        proc.wait()
        assert process_tree.still_alive(tree, within=10) == set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (os.path.exists(home) or os.path.exists(build)):
            time.sleep(0.05)
        assert not os.path.exists(home) and not os.path.exists(build)
        assert (keep / "precious").read_text() == "x"  # the link was not followed
    finally:
        proc.kill()
        if os.path.islink(swapped if "swapped" in locals() else ""):
            os.unlink(swapped)


def test_a_temporary_folder_removed_by_its_owner_is_forgotten_by_the_guard(tmp_path):
    path = lifecycle.temp_dir("sf-test-")
    assert os.path.isdir(path) and path in lifecycle._DIRS
    lifecycle.remove_dir(path)
    assert not os.path.exists(path) and path not in lifecycle._DIRS
    with lifecycle.temp_dir_for("sf-test-") as inner:
        assert os.path.isdir(inner)
    assert not os.path.exists(inner)


ORPHAN_PARENT = textwrap.dedent("""
    import os, signal, sys
    from swarmfactory import lifecycle
    a = lifecycle.temp_dir("sf-test-orphan-")
    b = lifecycle.temp_dir("sf-test-orphan-")
    os.rmdir(b)
    os.symlink(sys.argv[1], b)  # a link put in a folder's place
    print(a, b, flush=True)
    os.kill(lifecycle.guard_pid(), signal.SIGKILL)  # the guard dies first (a killed process group)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_folders_whose_owner_died_with_its_guard_go_at_the_next_sweep_and_nothing_through_a_link(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    out = subprocess.run([sys.executable, "-c", ORPHAN_PARENT, str(keep)], capture_output=True, text=True,
                         timeout=60).stdout.split()
    assert len(out) == 2, out
    left, link = out
    try:
        assert os.path.isdir(left)  # neither its owner nor the guard removed it
        mine = lifecycle.temp_dir("sf-test-live-")  # a live owner's: never swept
        try:
            gone = lifecycle.sweep_orphaned_dirs()
            assert left in gone and not os.path.exists(left)
            assert os.path.isdir(mine) and mine not in gone
            assert link not in gone and os.path.islink(link) and (keep / "precious").read_text() == "x"
            assert lifecycle.sweep_orphaned_dirs() == []  # forgotten once removed
        finally:
            lifecycle.remove_dir(mine)
    finally:
        if os.path.islink(link):
            os.unlink(link)


def test_what_the_guard_missed_is_ended_from_the_store_by_pid_and_start_time(tmp_path, process_tree):
    db = str(tmp_path / "e.db")
    Store(db)
    proc, (frozen, running, guard) = _start_parent(db)
    try:
        os.kill(guard, signal.SIGKILL)  # the guard dies first: the workers stay, frozen or not
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # a running worker sees its pipe close and exits; a frozen one cannot, and stays
        assert process_tree.still_alive({running}, within=10) == set()
        time.sleep(1.0)
        assert process_tree.still_alive({frozen}, within=0) == {frozen}
        ended = lifecycle.reap_recorded(ProcessLedger(Store(db)))  # what the next run on this store does first
        assert [(r["pid"], r["what"]) for r in ended] == [(frozen, "baseline worker")]
        assert process_tree.still_alive({frozen, running}, within=10) == set()
        assert lifecycle.reap_recorded(ProcessLedger(Store(db))) == []  # forgotten once ended
    finally:
        for pid in (frozen, running):
            lifecycle.kill_tree(pid)
        proc.kill()


def test_a_live_owner_s_processes_and_a_reused_pid_are_left_alone(tmp_path):
    db = str(tmp_path / "e.db")
    ledger = ProcessLedger(Store(db))
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        lifecycle.record_in(ledger)
        lifecycle.adopt(sleeper.pid, "test sleeper")
        assert lifecycle.reap_recorded(ProcessLedger(Store(db))) == []  # its owner (this process) is alive
        # a record whose start time no longer matches names another process now: never killed
        ledger.record(sleeper.pid, "1", "stale", 1, "0", lifecycle.boot_id())
        assert lifecycle.reap_recorded(ProcessLedger(Store(db))) == []
        assert sleeper.poll() is None
    finally:
        lifecycle.release(sleeper.pid)
        lifecycle.stop_recording(ledger)
        sleeper.kill()
        sleeper.wait()


def test_kill_9_of_eval_mid_measurement_leaves_nothing(tmp_path, process_tree):
    kernel = tmp_path / "k.c"
    kernel.write_text((__import__("pathlib").Path(__file__).parents[1] / "adversarial" / "rmsnorm" /
                       "correct_scalar.c").read_text())
    proc = subprocess.Popen([sys.executable, "-m", "swarmfactory.cli", "eval", "--problem", "rmsnorm",
                             str(kernel), "--store", str(tmp_path / "e.db")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, tree = time.monotonic() + 120, set()
        while time.monotonic() < deadline and proc.poll() is None:
            # the guard, a trusted worker and a candidate driver at least: measuring
            tree |= process_tree.descendants(proc.pid)
            if len(process_tree.descendants(proc.pid)) >= 3:
                time.sleep(1.0)
                tree |= process_tree.descendants(proc.pid)
                break
            time.sleep(0.1)
        assert proc.poll() is None and len(tree) >= 3, "the evaluation ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert process_tree.still_alive(tree, within=10) == set()
    finally:
        proc.kill()


# -- the one child process class ---------------------------------------------------------------------
SHOW = ("import os, resource, sys; r = lambda w: resource.getrlimit(w)[0]; "
        "print(r(resource.RLIMIT_AS), r(resource.RLIMIT_CPU), r(resource.RLIMIT_FSIZE), r(resource.RLIMIT_CORE), "
        "sorted(os.sched_getaffinity(0)), os.getpgid(0) == os.getpid() == os.getsid(0), sys.stdin.read() == '')")


def test_a_child_has_its_limits_its_own_session_and_is_released_when_closed(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[0]
    limits = lifecycle.Limits(mem_bytes=2 << 30, cpu_seconds=60, file_bytes=1 << 20, core_bytes=0, cpus=(cpu,))
    child = lifecycle.Child([sys.executable, "-S", "-c", SHOW], "test child", limits=limits,
                            log=str(tmp_path / "child.log"))
    try:
        assert lifecycle.adopted()[child.pid] == "test child" and child in lifecycle.children()
        assert child.wait(timeout=30) == 0
        assert child.log_tail().split() == [str(2 << 30), "60", str(1 << 20), "0", f"[{cpu}]", "True", "True"]
    finally:
        child.close()
    assert child.pid not in lifecycle.adopted() and child not in lifecycle.children()


# A parent that starts a child with a grandchild in its process group and a frozen child, ends
# them with kill_all while it lives on (the guard does nothing yet), and says what it saw.
KILL_ALL = textwrap.dedent("""
    import signal, sys, time
    from swarmfactory import lifecycle
    running = lifecycle.Child(["sh", "-c", "sleep 60 & sleep 60"], "test group")
    frozen = lifecycle.Child(["sleep", "60"], "test frozen")
    frozen.freeze()
    print(running.pid, frozen.pid, flush=True)
    sys.stdin.readline()
    lifecycle.kill_all()
    print(running.returncode == frozen.returncode == -signal.SIGKILL, frozen.frozen,
          sorted(lifecycle.adopted()), len(lifecycle.children()), flush=True)
    time.sleep(600)
""")


def test_kill_all_ends_frozen_and_running_children_with_their_process_groups(process_tree):
    proc = subprocess.Popen([sys.executable, "-c", KILL_ALL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        running, frozen = (int(x) for x in proc.stdout.readline().split())
        assert _state(frozen) == "T"
        deadline = time.monotonic() + 10
        while not process_tree.descendants(running) and time.monotonic() < deadline:
            time.sleep(0.05)  # the shell starts its background sleep
        tree = process_tree.descendants(running) | {running, frozen}
        assert len(tree) >= 3
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["True", "False", "[]", "0"]
        assert process_tree.still_alive(tree, within=10) == set()
        assert proc.poll() is None  # ended by kill_all, not by the guard
    finally:
        proc.kill()
        proc.wait()


def test_a_child_that_stops_itself_is_told_from_one_that_ended_and_its_pipe_carries_its_lines():
    code = ("import os, signal, sys; print('{\"event\": \"ready\"}', flush=True); "
            "os.kill(os.getpid(), signal.SIGSTOP); sys.exit(3)")
    child = lifecycle.Child([sys.executable, "-S", "-c", code], "test server", log=subprocess.PIPE)
    try:
        assert child.wait_stop() is True
        assert child.stdout.readline() == '{"event": "ready"}\n'
        assert child.poll() is None
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait_stop() is False
        assert child.returncode == 3 and os.WIFEXITED(child.status)
    finally:
        child.close()


def test_kill_9_during_the_tracer_probe_leaves_no_stopped_child():
    # tracer.available() probes on a child that stops itself; a parent killed with -9 while that
    # child is stopped (a coordinator killed mid-start) must not leave it stopped for ever
    script = textwrap.dedent("""
        import os, signal
        from swarmfactory.harness import tracer
        class Killed:
            def __init__(self, pid):
                print(pid, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        tracer._Attached = Killed
        tracer.available()
    """)
    proc = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}") and _state(child) != "Z":
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}") or _state(child) == "Z", _state(child)
