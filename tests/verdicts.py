"""Every verdict the matrix reports, with the test that breaks the thing checked (a broken
implementation, row or input: the verdict flips) and the test that breaks the checker (the
check turned off, its rule widened or its reading patched: the broken thing then gets past it).

One entry per name of ``nsa_cp_comm.harness.checks.CHECKS`` (a row's ``failed_check``), of
``matrix.review.compare.GATES``, of the two coverage rules (``matrix.review.coverage``) and
for the report's verdict and the benchmark's gate; tests/project/test_verdicts.py fails when
one has no pair or names a test that does not exist, and docs/design.md renders this table
(``python docs/doc_tables.py``). A test may be both of a pair where it runs the thing broken
and then the checker broken.
"""

from __future__ import annotations

CHECKS_OFF = "tests/lib/test_checks_off.py::test_a_check_turned_off_lets_its_broken_path_past_it"
BUGS_PAST = "tests/app/test_field_bugs.py::test_each_check_turned_off_lets_its_bugs_past_it"
BROKEN_PADDED = "tests/lib/test_checks.py::test_broken_padded_path_fails_its_check"
MISMATCH = "tests/harness/test_blame.py::test_the_correctness_groups_finding_is_what_names_a_mismatched_collective"
GATE_OFF = "tests/review/test_compare.py::test_each_gate_turned_off_lets_the_row_it_alone_trips_pass"
RULE_OFF = "tests/app/test_conformance.py::test_each_coverage_rule_broken_lets_its_gap_pass"

# verdict -> (breaks the thing, breaks the checker)
VERDICTS: dict[str, tuple[str, str]] = {
    # a row's failed_check
    "input_mutated": (BROKEN_PADDED, CHECKS_OFF),
    "gather_shape": ("tests/harness/test_blame.py::test_a_short_gather_fails_once_and_the_rest_is_not_run",
                     CHECKS_OFF),
    "gather_rows": (BROKEN_PADDED, CHECKS_OFF),
    "physical_len": ("tests/lib/test_pad_at_split.py::test_broken_pad_at_split_fails_its_check", CHECKS_OFF),
    "padding_zero": (BROKEN_PADDED, BUGS_PAST),
    "scatter_chunk": (BROKEN_PADDED, BUGS_PAST),
    "side_tensors": ("tests/lib/test_side_tensors.py::test_a_side_tensor_in_another_layout_or_not_gathered_is_named",
                     "tests/lib/test_side_tensors.py::test_with_the_check_off_the_experts_route_by_the_misplaced_logits"),
    "padding_routing": ("tests/lib/test_padding_routing.py::test_a_padding_mark_that_is_not_the_padding_rows_is_named",
                        "tests/lib/test_padding_routing.py::test_with_the_check_off_unmarked_padding_is_routed_unseen"),
    "reference_moe": ("tests/lib/test_shared_expert.py::"
                      "test_a_replicated_term_added_before_the_reduce_scatter_fails_at_every_cp", BUGS_PAST),
    "even_bitwise": ("tests/lib/test_checks.py::test_even_bitwise_catches_what_tolerances_allow", CHECKS_OFF),
    "refusal": ("tests/lib/test_checks.py::test_refusal_verdict_fails_for_a_wrong_refusal", CHECKS_OFF),
    "group": ("tests/harness/test_blame.py::test_the_global_rank_mistake_is_named_as_such", BUGS_PAST),
    "passthrough": ("tests/lib/test_checks.py::test_scattered_verdicts_fail_when_broken", CHECKS_OFF),
    "dispatch_rows": ("tests/lib/test_checks.py::test_scattered_verdicts_fail_when_broken", CHECKS_OFF),
    "production_form": ("tests/lib/test_timed_check.py::test_a_timed_form_that_cheats_fails_and_the_honest_ones_pass",
                        "tests/lib/test_timed_check.py::test_without_the_check_every_cheat_would_pass"),
    "rank_agreement": ("tests/harness/test_fold.py::test_ranks_that_disagree_are_a_failed_row_naming_rank_agreement",
                       "tests/harness/test_fold.py::test_with_the_agreement_rule_broken_the_first_ranks_outcome_passes"),
    "collective_skipped": ("tests/lib/test_vllm_plugin.py::test_a_rank_that_skips_the_gather_on_no_rows_is_named",
                           MISMATCH),
    "collective_shapes": (MISMATCH, MISMATCH),
    "rank_state": ("tests/harness/test_rank_state.py::"
                   "test_a_plug_in_that_changes_its_ranks_gets_the_failed_row_and_the_others_are_rerun_on_fresh_ranks",
                   "tests/harness/test_rank_state.py::"
                   "test_a_plug_in_that_fools_the_state_check_still_leaves_the_next_point_fresh_ranks"),
    # compare's gates
    "missing": ("tests/review/test_compare.py::test_missing_point_fails_unless_allowed", GATE_OFF),
    "status-worse": ("tests/review/test_compare.py::test_status_change", GATE_OFF),
    "failing-in-new": ("tests/review/test_compare.py::test_bad_to_good_passes_and_bad_to_bad_fails", GATE_OFF),
    "correctness-lost": ("tests/review/test_compare.py::test_correctness_loss_fails", GATE_OFF),
    "regressed": ("tests/review/test_compare_samples.py::test_a_significant_paired_regression_beyond_the_threshold_fails",
                  GATE_OFF),
    "unverified": ("tests/review/test_compare.py::test_the_paired_metric_without_samples_or_spread_is_unverified",
                   GATE_OFF),
    # coverage
    "ran nothing": ("tests/app/test_conformance.py::test_gaps_count_the_rows_an_outside_impl_ran", RULE_OFF),
    "ran no uneven plan": ("tests/app/test_conformance.py::test_a_plan_of_several_classes_counts_as_uneven_by_any_of_them",
                           RULE_OFF),
    # the report's verdict and the benchmark's gate
    "report verdict": ("tests/review/test_report.py::test_a_failing_folder_exits_1_with_its_verdict_and_reasons_in_the_json",
                       "tests/review/test_report.py::test_the_verdict_is_its_two_rules_each_broken_lets_its_rows_pass"),
    "bench gate": ("tests/project/test_bench.py::test_gate_rule",
                   "tests/project/test_bench.py::test_a_slow_padded_path_fails_the_gate"),
}
