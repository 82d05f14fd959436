"""The agent: it proposes bounded trials of the training core, runs them, and learns from their summaries and
exit codes, so that it does not pay for the same failure twice; then it confirms its winner against the noise and
exports it to the stacks people run.

The packages, in import order (a package imports only those before it; tests/unit/test_architecture.py checks):

    records.py       statuses, skips, trial rows, config identity: what every part shares
    core_adapter.py  everything that knows the core: its command, its summaries, its config schema, its estimate
    space/           search spaces: the file, its params, its constraints, checked against the core
    study/           the Optuna study: telling outcomes, reaping, confirmation, the cost ledger
    search/          choosing the next trial and deciding whether it runs: proposers, gate, feasibility memory
    execute/         where trials run: processes on this machine (local) or Slurm jobs, waited for alike
    run/             a session: trials side by side in their slots, one local trial without a study
    report/          tables, plots, HTML, the terminal
    plan.py          ``python -m autoresearch.plan``: a space ranked by the step-time model before any trial
    export/          the winner as the config of another stack (MindFormers, torchtitan, the core's overrides)
    cli.py           the command line, generated from the session's options
    agent.py         ``python -m autoresearch.agent``
"""
