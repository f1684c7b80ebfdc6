"""TRL's GRPO on the tiny model, as its users run it: a word-level tokenizer made here (no hub), a plain reward
function, DeepSpeed from ``GRPOConfig(deepspeed=...)`` (F18; F25's CUDA path). Heavy imports stay inside functions."""

from __future__ import annotations

from typing import Any

from repros.runtime.context import RankContext


def _tokenizer() -> Any:
    """A word-level tokenizer over the tiny model's vocabulary (``w3`` .. ``w127``), made here: no hub."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from repros.trainer.tiny_models import VOCAB_SIZE

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2} | {f"w{i}": i for i in range(3, VOCAB_SIZE)}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def length_reward(completions: list[Any], **_: Any) -> list[float]:
    """The reward: a completion's length in characters (a plain function, no reward model)."""
    return [float(len(str(c))) for c in completions]


def train_grpo(ctx: RankContext, scenario: Any, beta: float, **config: Any) -> None:
    """TRL's ``GRPOTrainer`` on the tiny Qwen2 saved as a checkpoint, DeepSpeed from ``GRPOConfig(deepspeed=...)``,
    ``beta`` its KL coefficient (> 0: a reference model), ``config`` more ``GRPOConfig`` fields."""
    import torch.distributed as dist
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from repros.trainer import adapter_io
    from repros.trainer.hf_trainer import trainer_deepspeed_config

    with adapter_io.shared_workdir() as work:
        base_dir = adapter_io.save_base_checkpoint(work)
        prompts = [" ".join(f"w{3 + (i * 7 + j) % 100}" for j in range(4)) for i in range(8)]
        args = GRPOConfig(
            output_dir=str(work / "grpo"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=6,
            max_steps=ctx.steps,
            learning_rate=1e-4,
            # The config's WarmupLR needs at least one warm-up step (DeepSpeed >= 0.19 refuses 0).
            warmup_steps=1,
            beta=beta,
            bf16=scenario.bf16,
            use_cpu=ctx.device_type == "cpu",
            deepspeed=trainer_deepspeed_config(scenario),
            # On a CPU accelerate's distributed type is not one TRL clears device_map for.
            model_init_kwargs={"device_map": None},
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            dataloader_pin_memory=False,
            **config,
        )
        losses: list[float] = []

        class _Steps(TrainerCallback):
            def on_train_begin(self, *a: Any, **kw: Any) -> None:
                ctx.meters.training_begins()

            def on_step_begin(self, *a: Any, **kw: Any) -> None:
                ctx.meters.resume()

            def on_step_end(self, *a: Any, **kw: Any) -> None:
                ctx.meters.pause()
                ctx.meters.end_step()

            def on_log(self, _args: Any, _state: Any, _control: Any, logs: Any = None, **kw: Any) -> None:
                if logs and "loss" in logs:
                    losses.append(float(logs["loss"]))

        trainer = GRPOTrainer(
            model=str(base_dir),
            reward_funcs=length_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=_tokenizer(),
            callbacks=[_Steps()],
        )
        ctx.facts["reference_model"] = trainer.ref_model is not None
        trainer.train()
        steps = int(trainer.state.global_step)
        ctx.facts["grpo"] = {"steps": steps, "losses": losses}
        if steps != ctx.steps:
            raise RuntimeError(f"GRPO stopped after {steps} of {ctx.steps} steps")
        if dist.is_initialized():
            dist.barrier()
