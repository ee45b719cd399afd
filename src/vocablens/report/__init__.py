"""The report runner (between the analyses and render): plans the sections of ``vocablens report``
within a time budget and runs them; the page itself is :mod:`vocablens.render.report`."""

from vocablens.report.runner import AFTER_SCAN, ARGMAX_MIN_SHARE, ASSUMED_FLOPS_PER_S, DEFAULT_BUDGET_S, DEFAULT_PROMPT, NEIGHBOR_TOKENS, ORDER, PROBE_TOKENS, ReportRun, SECTIONS, SectionPlan, SectionRun, after_scan_share, argmax_share, eta_s, plan_report, plural, run_report, settle_tokens  # noqa: F401
