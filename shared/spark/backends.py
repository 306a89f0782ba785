"""The table of Spark backends (name -> class, settings, state mapping), read and checked at start-up.

`BACKENDS` is the one list: `SPARK_BACKEND` accepts its names, `read_spark` reads the chosen
backend's own settings with the common ones and refuses an incoherent configuration naming the
setting, and `make_backend` builds it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace

from shared.core.errors import NotAvailable, SettingsError
from shared.core.setting_reader import SettingReader
from shared.spark.config import STEP_MARGIN_S, BackendOptions, SparkSettings, read_common
from shared.spark.databricks import DatabricksBackend, DatabricksOptions
from shared.spark.fabric import FABRIC_API, FabricBackend, FabricOptions
from shared.spark.livy import LivyBackend, LivyOptions
from shared.spark.model import RunState, SparkBackend
from shared.spark.standalone import StandaloneBackend, StandaloneOptions
from shared.spark.states import DATABRICKS_LIFE_CYCLE, FABRIC, LIVY, STANDALONE


@dataclass(frozen=True)
class BackendEntry:
    """One backend: how to build it, its own settings, and its state vocabulary."""

    factory: Callable[[SparkSettings], SparkBackend]
    read_options: Callable[[SettingReader, str], BackendOptions]
    states: Mapping[str, RunState]
    duplicate_check: str
    """How a submit whose answer was lost is told from one that never arrived."""
    default_max_concurrent_runs: int = 0
    default_url: str = ""
    """`SPARK_URL` when unset ('' : required)."""


BACKENDS: Mapping[str, BackendEntry] = {
    "standalone": BackendEntry(
        StandaloneBackend,
        StandaloneOptions.read,
        STANDALONE,
        "drivers listed in the master's UI, matched by app name",
        default_max_concurrent_runs=1,
    ),
    "livy": BackendEntry(LivyBackend, LivyOptions.read, LIVY, "batches listed and matched by name"),
    "databricks": BackendEntry(
        DatabricksBackend, DatabricksOptions.read, DATABRICKS_LIFE_CYCLE, "idempotency_token"
    ),
    "fabric": BackendEntry(
        FabricBackend,
        FabricOptions.read,
        FABRIC,
        "batches listed and matched by name",
        default_url=FABRIC_API,
    ),
}
NAMES: tuple[str, ...] = ("none", *BACKENDS)
"""What `SPARK_BACKEND` accepts."""


def read_spark(r: SettingReader, function_timeout_s: float) -> SparkSettings:
    """The Spark settings, typed and checked (problems go to the reader, naming the setting)."""
    name = r.choice("SPARK_BACKEND", "none", NAMES)
    entry = BACKENDS.get(name)
    spark = read_common(
        r, name, entry.default_max_concurrent_runs if entry else 0, entry.default_url if entry else ""
    )
    if entry is None:
        return spark
    spark = replace(spark, options=entry.read_options(r, spark.url))
    if not r.text("SPARK_STEP_BUDGET_SECONDS", ""):  # default: room for one call at its worst
        spark = replace(spark, step_budget_s=max(spark.step_budget_s, spark.request_worst_case_s()))
    for problem in check_spark(spark, function_timeout_s):
        r.problem(problem)
    return spark


def spark_from_env(env: Mapping[str, str], function_timeout_s: float = 600.0) -> SparkSettings:
    """Read Spark settings alone (tools and tests); SettingsError naming every bad setting."""
    problems: list[str] = []
    spark = read_spark(SettingReader(env, problems), function_timeout_s)
    if problems:
        raise SettingsError("invalid settings: " + "; ".join(problems))
    return spark


def check_spark(spark: SparkSettings, function_timeout_s: float) -> list[str]:
    """Settings that cannot work together: required values, and time budgets that do not nest."""
    if spark.backend == "none":
        return []
    problems: list[str] = []
    if not spark.url:
        problems.append(f"SPARK_URL is required when SPARK_BACKEND={spark.backend}")
    if not spark.job_file:
        problems.append(f"SPARK_JOB_FILE is required when SPARK_BACKEND={spark.backend}")
    if spark.poll_max_s < spark.poll_initial_s:
        problems.append(
            f"SPARK_POLL_MAX_SECONDS ({spark.poll_max_s}) must be at least "
            f"SPARK_POLL_INITIAL_SECONDS ({spark.poll_initial_s})"
        )
    if spark.run_timeout_s <= spark.poll_max_s:
        problems.append(
            f"SPARK_RUN_TIMEOUT_SECONDS ({spark.run_timeout_s:g}) must be longer than "
            f"SPARK_POLL_MAX_SECONDS ({spark.poll_max_s}), or a run could pass it between two checks"
        )
    options = spark.options
    if (
        spark.backend in ("livy", "databricks", "fabric")
        and options is not None
        and not options.server_timeout_s < spark.read_timeout_s
    ):
        problems.append(
            f"SPARK_DOWNSTREAM_TIMEOUT_SECONDS ({options.server_timeout_s:g}) must be less than "
            f"SPARK_READ_TIMEOUT_SECONDS ({spark.read_timeout_s:g})"
        )
    one_call = spark.request_worst_case_s()
    if not one_call <= spark.step_budget_s:
        problems.append(
            f"SPARK_STEP_BUDGET_SECONDS ({spark.step_budget_s:g}) must hold one Spark call at its worst: "
            f"3 x (SPARK_CONNECT_TIMEOUT_SECONDS + SPARK_READ_TIMEOUT_SECONDS) + "
            f"2 x SPARK_RETRY_AFTER_MAX_SECONDS = {one_call:g}s"
        )
    if not spark.step_budget_s + STEP_MARGIN_S <= function_timeout_s:
        problems.append(
            f"SPARK_STEP_BUDGET_SECONDS ({spark.step_budget_s:g}) + {STEP_MARGIN_S:g}s for storage work "
            f"must fit in host.json functionTimeout ({function_timeout_s:g}s)"
        )
    return problems


_lock = threading.Lock()
_cache: dict[str, SparkBackend] = {}


def make_backend(spark: SparkSettings) -> SparkBackend:
    """A new backend for these settings; NotAvailable when SPARK_BACKEND is none."""
    entry = BACKENDS.get(spark.backend)
    if entry is None:
        raise NotAvailable(
            f"engine 'spark' is not available: SPARK_BACKEND is not set ({', '.join(BACKENDS)})"
        )
    return entry.factory(spark)


def backend_for(spark: SparkSettings) -> SparkBackend:
    """The backend of these settings, built once per configuration."""
    common = {k: v for k, v in asdict(replace(spark, options=None)).items()}
    options = asdict(spark.options) if spark.options is not None else None  # type: ignore[call-overload]
    key = json.dumps([common, options], sort_keys=True, default=str)
    with _lock:
        backend = _cache.get(key)
        if backend is None:
            backend = make_backend(spark)
            _cache[key] = backend
        return backend
