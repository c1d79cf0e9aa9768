"""Hostile kernels and sandbox tests whose expected outcome the harness does not give yet.

Keys are test ids: ``<problem>/<kernel>`` for tests/adversarial/<problem>/<kernel>.c (run by
test_adversarial.py), ``kernelbench/<file>/<kernel>`` (test_kernelbench_literal.py), the
parametrised ids of test_sandbox_layers.py, or a plain test name. conftest.py marks each xfail
(not strict: some holes are probabilistic) with the reason below. Remove an entry when the harness
is fixed: the test then holds the line.
"""

KNOWN_HOLES: dict[str, str] = {
    # -- tests/adversarial/<problem>/*.c ------------------------------------------------------
    "swiglu/skips_calls_by_counting":
        "not a hole any more in the sense that matters (audits now stop at moments of the trusted "
        "clock's choosing, so they land in the faked stretch: `cheated` in 2 of 3 runs), but when "
        "no audit happens to, the kernel is slower than torch anyway: `not_faster`; `faster` never",
    "rmsnorm/predicts_mutations":
        "not a hole any more (trusted probes written during each run make a kernel that only "
        "patches the driver's predicted mutations wrong), but the outcome is `cheated` when it is "
        "caught and `not_faster` when the incremental path did not engage: both are right, "
        "`faster` never is; the exact-outcome test cannot say so",
    # -- tests/adversarial/kernelbench/ --------------------------------------------------------
    # -- tests/adversarial/test_sandbox_layers.py ----------------------------------------------
    "names-call:rmsnorm/pasted_thread_name":
        "pthread_create blocks SIGSYS around clone3, so the trap cannot run the driver's handler: "
        "`cheated` with the call `unknown`",
    "names-call:rmsnorm/spawns_thread":
        "pthread_create blocks SIGSYS around clone3: `cheated` with the call `unknown`",
    "names-call:softmax/dlsym_thread_finishes_later":
        "pthread_create blocks SIGSYS around clone3: `cheated` with the call `unknown`",
    "names-call:softmax/blocks_sigsys_then_forks":
        "SIGSYS blocked by the kernel itself (rt_sigprocmask is allowed): `cheated` with the call "
        "`unknown`",
    "test_a_daemon_that_scrubs_its_environment_is_found_without_a_cgroup":
        "token containment reads /proc/<pid>/environ, which is the process's own writable memory: "
        "a daemon that overwrites its environment strings is never found (only matters if the "
        "allow-list is bypassed and no cgroup is available)",
    "test_a_daemon_that_moves_itself_out_of_the_cgroup_is_found":
        "the candidate runs as the coordinator's user (root here): a daemon may write its pid to "
        "the parent cgroup's cgroup.procs and leave the evaluation's cgroup (only matters if the "
        "allow-list is bypassed); no user namespace or uid drop",
}
