"""Callbacks that forward a run's step metrics to experiment trackers,
under the tags TensorBoard gets (docs/metrics.md: train/loss, perf/tflops,
...): Weights & Biases (`wandb`) and MLflow (`mlflow` or `mlflow-skinny`).

    from megatrain.integrations import MLflowCallback, WandbCallback, chain
    with WandbCallback(project="sft") as wb:
        megatrain.train(config, on_event=chain(megatrain.print_event, wb))

Each is a callable for `on_event`: at every "step" event it logs that
step's finite metrics at the step's number. The tracker's run is started at
the first step (or given), and ended by `finish()` or the `with` block, so
that a Run stepped in parts logs into one run. A tracker that is not
installed is an error at construction, naming the package to install."""
import math
import time

from . import _lib

# metric -> tag, as the library writes them to TensorBoard
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "epoch": "train/epoch", "tokens": "train/tokens", "tokens_per_s": "perf/tokens_per_s",
        "tflops": "perf/tflops", "step_time_s": "perf/step_time_s", "h2d_gbps": "perf/h2d_gbps",
        "d2h_gbps": "perf/d2h_gbps", "gpu_mem_gb": "memory/gpu_gb",
        "host_mem_gb": "memory/host_gb"}


def scalars(metrics):
    """The tags and values of a step's metrics (a "step" event's `step`);
    those that do not apply (None) or are not finite are left out."""
    out = {}
    for key, tag in TAGS.items():
        v = metrics.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[tag] = float(v)
    return out


def chain(*callbacks):
    """One on_event callable that calls each of callbacks (None: skipped) in
    order: chain(megatrain.print_event, WandbCallback())."""
    fns = [c for c in callbacks if c is not None]

    def call(event):
        for fn in fns:
            fn(event)
    return call


def _need(module, package):
    try:
        return __import__(module)
    except ImportError:
        raise _lib.MegatrainError(
            f"{module} is not installed: pip install {package} (or leave the callback out)") from None


class _Tracker:
    """A callback that starts its tracker's run at the first step."""

    def __call__(self, event):
        if event.kind == "step" and event.step:
            values = scalars(event.step)
            if values:
                self._log(values, int(event.step["step"]))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.finish(failed=exc_type is not None)


class WandbCallback(_Tracker):
    """Logs each step's metrics to a Weights & Biases run: `run` (a run of
    wandb.init), else one started with wandb.init(**init) (project=,
    name=, config=, mode="offline", dir=, ...) at the first step."""

    def __init__(self, run=None, **init):
        self.wandb = _need("wandb", "wandb")
        self.run, self.init, self.owned = run, init, False

    def _log(self, values, step):
        if self.run is None:
            self.run, self.owned = self.wandb.init(**self.init), True
        self.run.log(values, step=step)

    def finish(self, failed=False):
        """Ends the run this callback started (not one it was given); exit
        code 1 when failed."""
        if self.owned and self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
        self.owned = False


class MLflowCallback(_Tracker):
    """Logs each step's metrics to an MLflow run: `run_id` (an existing
    run), else a new one (mlflow.start_run: experiment_name=, run_name=,
    params= logged once) at the first step, at tracking_uri (None:
    MLFLOW_TRACKING_URI or mlflow's default)."""

    def __init__(self, run_id=None, *, tracking_uri=None, experiment_name=None, run_name=None,
                 params=None):
        mlflow = _need("mlflow", "mlflow-skinny")
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient
        self.client, self.metric = MlflowClient(tracking_uri=tracking_uri), Metric
        self.mlflow, self.run_id, self.owned = mlflow, run_id, False
        self.experiment_name, self.run_name, self.params = experiment_name, run_name, params

    def _start(self):
        exp_id = "0"
        if self.experiment_name:
            exp = self.client.get_experiment_by_name(self.experiment_name)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(
                self.experiment_name)
        run = self.client.create_run(exp_id, run_name=self.run_name)
        self.run_id, self.owned = run.info.run_id, True
        for k, v in (self.params or {}).items():
            self.client.log_param(self.run_id, k, v)

    def _log(self, values, step):
        if self.run_id is None:
            self._start()
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.metric(k, v, now, step)
                                                    for k, v in values.items()])

    def finish(self, failed=False):
        """Ends the run this callback started: FINISHED, or FAILED."""
        if self.owned and self.run_id is not None:
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
        self.owned = False
