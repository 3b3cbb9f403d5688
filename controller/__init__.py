"""Run scheduling: what to run next, how much may be in flight, and what to do about lost work.

    crucible controller            # the loop: leader lock → per active run: reconcile, dispatch

Modules, one idea each:
    runs        create (pin environment versions), stop, resume, get, list runs
    picking     the next task of a run: environment weights, split, curriculum band and buckets, coverage
    dispatch    groups of G episodes to Celery queues within the in-flight target, staleness bound, budget
    reconcile   overdue episodes: worker lost → redispatch (bounded), slow → leave; unsent → re-send
    leader      the Postgres advisory lock that makes one controller the dispatcher
    loop        `Controller.step()` and `run_forever()`
    pass_rate   pass-rate jobs and the curriculum statistics they record on tasks
    dispatcher  the seam to the broker: Celery's `send_task`, or an in-memory recorder
    config      the controller's own knobs; run configs from files and back from the database
    progress    a run's groups and episodes by status; the public view of a run

All state lives in Postgres, so a controller can be killed and restarted (or replaced) at any time.
"""
