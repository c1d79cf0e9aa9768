"""Hostile kernels whose expected outcome the harness does not give yet.

Each entry is a kernel in tests/adversarial/<problem>/ (id ``<problem>/<stem>``) whose header
states the outcome the finished harness must give; until the hole is closed, its test is marked
xfail (not strict: some holes are probabilistic) with the reason below. Remove an entry when the
harness is fixed: the test then holds the line.
"""

KNOWN_HOLES: dict[str, str] = {
    "rmsnorm/nan_dropped_at_hidden_width":
        "special values (NaN, -0.0, denormals) are never tried at the exact workload shapes, so a "
        "fast path taken only there may drop NaN: it gets `faster`",
    "swiglu/tail_bug_residue_5":
        "the seed widths leave remainders 0, 1, 3 and 7 mod 8 only; a tail bug at n % 8 == 5 gets "
        "`faster`",
    "rmsnorm/predicts_mutations":
        "the driver's per-call input mutation is predictable from its command record (seed on the "
        "driver's stack, splitmix in the open) and calibration outputs are never checked: an "
        "honestly ~100x slower kernel updates one row and one column per call and gets `faster`",
    "swiglu/skips_calls_early_in_a_sample":
        "a timed run is never stopped before sample_ms (4 ms) and calibration outputs are never "
        "checked: a kernel that reads the clock (weakref alias of clock_gettime) skips all work "
        "early in every run and gets `faster`",
    "rope/hides_ftz_by_redirecting_replies":
        "the driver's reply_fd is a writable global and the reply pipe accepts the candidate's own "
        "records: a kernel redirects the driver's replies to stderr and forges fp_after == "
        "fp_before, so FTZ/DAZ left on is not seen (it loses a race at halt now and then: crashed)",
    "swiglu/ifunc_leaks_coordinator_env":
        "the load-time filter lets any code that runs inside dlopen (here a GNU ifunc resolver, "
        "which no static check looks for) open and read any file, /proc/<coordinator>/environ "
        "included, and a crash verdict quotes the candidate's stderr: secrets leak into the "
        "verdict (`crashed`, not `cheated`)",
    "softmax/dlsym_thread_finishes_later":
        "glibc's pthread_create blocks every signal around clone3, so the sandbox's SIGSYS trap "
        "cannot reach the driver's handler and the kernel kills the process with SIGSYS: the "
        "verdict is `crashed` without the call, not `cheated`",
    "softmax/blocks_sigsys_then_forks":
        "a forbidden call made with SIGSYS blocked (rt_sigprocmask is allowed) kills the process "
        "with SIGSYS: the verdict is `crashed`, not `cheated` naming the call",
    "attention_decode/bf16_when_values_small":
        "on small-magnitude cases (the `tiny` distribution) outputs are ~1e-5 .. 1e-4, below the "
        "fixed atol of 1e-4: a bf16 (or 10%) error passes, and the trivial-answer check does not "
        "tighten because zeros stay just outside; verdict is the kernel's speed, not `wrong`",
    "kernelbench/23_Softmax/drops_small_outputs":
        "a case tightened against a trivial answer gets atol = half that answer's worst error "
        "(~2e-3 for 16384-wide softmax rows), still 30x the typical output: a softmax that writes 0 "
        "for all but a handful of outputs per row (rows sum to ~0.01) passes and gets `faster`",
    # tests/adversarial/test_sandbox_layers.py
    "names-call:rope/renices_the_baseline":
        "setpriority (and getpriority, sched_setscheduler, ...) are missing from candidate.py's "
        "system-call name table: the verdict names the call `#141`",
    "names-call:rmsnorm/pasted_thread_name":
        "pthread_create blocks SIGSYS around clone3: killed by SIGSYS, `crashed`, call not named",
    "names-call:rmsnorm/spawns_thread":
        "pthread_create blocks SIGSYS around clone3: killed by SIGSYS, `crashed`, call not named",
    "names-call:softmax/dlsym_thread_finishes_later":
        "pthread_create blocks SIGSYS around clone3: killed by SIGSYS, `crashed`, call not named",
    "names-call:softmax/blocks_sigsys_then_forks":
        "SIGSYS blocked by the kernel itself: killed by SIGSYS, `crashed`, call not named",
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
    "test_load_time_code_cannot_read_the_coordinators_secrets":
        "the load-time filter allows opening any file read-only: an ifunc resolver reads "
        "/proc/<coordinator>/environ and the crash verdict quotes what it wrote to stderr",
}
