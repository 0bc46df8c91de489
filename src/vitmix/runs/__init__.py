"""What every training task shares (``vitmix train``, ``vitmix generate train``, ``vitmix dense train``):
the run directory (:mod:`.directory`), checkpoint IO and :func:`load_model` (:mod:`.checkpoints`), one
epoch's checkpoint set and ``--resume`` (:mod:`.resume`), one checked optimizer step (:mod:`.optim`),
``--device`` (:mod:`.device`), torchrun set-up (:mod:`.distributed`), the YAML config and CLI flags
(:mod:`.flags`), and which task's code evaluates a checkpoint (:mod:`.tasks`). A task keeps only its
loop, its config class, its checkpoint files and the fields a resume may change."""
from .._lazy import lazy_attributes

# names are imported on first use, so the CLI's parsers (which use .flags) start without torch
_EXPORTS = {
    "ABORTED": ".directory:ABORTED",
    "BEST_FIRST": ".checkpoints:BEST_FIRST",
    "EMA_FIRST": ".checkpoints:EMA_FIRST",
    "Resumed": ".resume:Resumed",
    "Trainable": ".resume:Trainable",
    "abort_message": ".directory:abort_message",
    "atomic_write": ".checkpoints:atomic_write",
    "build_classifier": ".checkpoints:build_classifier",
    "check_replaceable": ".directory:check_replaceable",
    "check_output_dir": ".directory:check_output_dir",
    "check_resumable": ".directory:check_resumable",
    "check_subset": ".resume:check_subset",
    "checkpoint_task": ".tasks:checkpoint_task",
    "checked_step": ".optim:checked_step",
    "clear_aborted": ".directory:clear_aborted",
    "default_device": ".device:default_device",
    "evaluator": ".tasks:evaluator",
    "file_digest": ".checkpoints:file_digest",
    "flag_of": ".directory:flag_of",
    "load_checkpoint": ".checkpoints:load_checkpoint",
    "load_into": ".checkpoints:load_into",
    "load_meta": ".checkpoints:load_meta",
    "load_model": ".checkpoints:load_model",
    "load_state": ".checkpoints:load_state",
    "load_weights": ".checkpoints:load_weights",
    "model_meta": ".checkpoints:model_meta",
    "parse_device": ".device:parse_device",
    "prepare_run_dir": ".directory:prepare_run_dir",
    "read_checkpoint": ".checkpoints:read_checkpoint",
    "read_state_dict": ".checkpoints:read_state_dict",
    "recorded_abort": ".directory:recorded_abort",
    "remove_stray_temporaries": ".directory:remove_stray_temporaries",
    "resolve_checkpoint": ".checkpoints:resolve_checkpoint",
    "resolve_ema": ".checkpoints:resolve_ema",
    "resume_run": ".resume:resume_run",
    "resuming_line": ".resume:resuming_line",
    "rng_state": ".resume:rng_state",
    "run_directory": ".directory:run_directory",
    "save_manifest": ".resume:save_manifest",
    "save_metrics": ".resume:save_metrics",
    "save_run_config": ".directory:save_run_config",
    "save_state": ".checkpoints:save_state",
    "save_text": ".checkpoints:save_text",
    "save_weights": ".checkpoints:save_weights",
    "seeded_subset": ".resume:seeded_subset",
    "set_rng_state": ".resume:set_rng_state",
    "unwrap": ".checkpoints:unwrap",
}
__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
