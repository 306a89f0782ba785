"""The app's job queues (`JOBS_QUEUES`) and each one's settings (`QUEUE_<NAME>_<SETTING>`).

Pure: read once at start-up from the app settings. The pipeline, the API and the wiring ask this
package which queues exist and what each allows; it asks nothing of them.
"""

from shared.queues.queue_settings import (
    DEFAULT_QUEUE,
    SETTINGS,
    QueueSet,
    QueueSettings,
    UnknownQueue,
    env_name,
    fair_share_wired,
    read_queues,
    setting_name,
    trigger_connection,
    wired_names,
)

__all__ = [
    "DEFAULT_QUEUE",
    "SETTINGS",
    "QueueSet",
    "QueueSettings",
    "UnknownQueue",
    "env_name",
    "fair_share_wired",
    "read_queues",
    "setting_name",
    "trigger_connection",
    "wired_names",
]
