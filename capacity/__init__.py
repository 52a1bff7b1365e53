"""Capacity planning before deployment: how many slots (StreamBed's MST search, scaling models and
resource explorer) and which executor profile (QEScalor) a job needs for a rate it has not run, on a
testbed (the evaluation's job model, the live job, a standalone cluster), and the seeding of the plan
into a registered job's configuration. `autoscaler capacity ...` is its command line. Online planning,
from what a running job measures, is `plan`; the plan reaches it only through the job's
`planned_capacity` setting. Imports no agent code."""
