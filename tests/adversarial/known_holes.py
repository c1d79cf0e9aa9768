"""Hostile kernels and sandbox tests whose expected outcome the harness does not give yet.

Keys are test ids: ``<problem>/<kernel>`` for tests/adversarial/<problem>/<kernel>.c (run by
test_adversarial.py), ``kernelbench/<file>/<kernel>`` (test_kernelbench_literal.py), the
parametrised ids of test_sandbox_layers.py, or a plain test name. conftest.py marks each xfail
(not strict: some holes are probabilistic) with the reason below. Remove an entry when the harness
is fixed: the test then holds the line.
"""

KNOWN_HOLES: dict[str, str] = {
    # -- tests/adversarial/<problem>/*.c ------------------------------------------------------
    "rope/forges_call_counter":
        "the driver's call counter is in the shared arena and the trusted side uses what it reads "
        "unbounded: a kernel that writes 2^40 into it at the start of each timed call makes "
        "np.arange(calls) raise an 8 TiB MemoryError in the coordinator (an exception, no verdict)",
    "rmsnorm/x87_precision_left_single":
        "only MXCSR is compared after each call: a kernel that changes the x87 control word "
        "(precision control to 24 bits, through fesetenv) and leaves it is not seen",
    "swiglu/skips_calls_by_counting":
        "skipping work early in each timed run without any clock (counting calls, after learning "
        "the shortest run) is caught only when an audit happens to stop inside the skipped stretch",
    "rmsnorm/predicts_mutations":
        "not a hole any more (trusted probes written during each run make a kernel that only "
        "patches the driver's predicted mutations wrong), but the outcome is `cheated` when it is "
        "caught and `not_faster` when the incremental path did not engage: both are right, "
        "`faster` never is; the exact-outcome test cannot say so",
    # -- tests/adversarial/kernelbench/ --------------------------------------------------------
    "kernelbench/23_Softmax/drops_small_outputs":
        "a case tightened against a trivial answer gets atol = half that answer's worst error "
        "(~2e-3 for 16384-wide softmax rows), still 30x the typical output: a softmax that writes 0 "
        "for all but a handful of outputs per row (rows sum to ~0.01) passes verification",
    # -- tests/adversarial/test_sandbox_layers.py ----------------------------------------------
    "names-call:rope/renices_the_baseline":
        "setpriority (and getpriority, sched_setscheduler, ...) are missing from candidate.py's "
        "system-call name table: the verdict names the call `#141`",
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
    "isolation-recorded:rmsnorm/macro_hidden_constructor":
        "a rejection while the library loads (inside CandidateProcess.__init__) leaves "
        "prep.extra['isolation'] unset: the verdict does not say which isolation was in force",
    "isolation-recorded:q4_1_matmul/ifunc_patches_coordinator":
        "a rejection while the library loads leaves the isolation out of the verdict's evidence",
    "test_a_daemon_that_scrubs_its_environment_is_found_without_a_cgroup":
        "token containment reads /proc/<pid>/environ, which is the process's own writable memory: "
        "a daemon that overwrites its environment strings is never found (only matters if the "
        "allow-list is bypassed and no cgroup is available)",
    "test_a_daemon_that_moves_itself_out_of_the_cgroup_is_found":
        "the candidate runs as the coordinator's user (root here): a daemon may write its pid to "
        "the parent cgroup's cgroup.procs and leave the evaluation's cgroup (only matters if the "
        "allow-list is bypassed); no user namespace or uid drop",
}
