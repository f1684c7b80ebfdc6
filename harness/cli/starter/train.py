"""Fine-tune a small causal LM with LoRA under DeepSpeed ZeRO-3 and gradient checkpointing.

A plain training script, as you would start it yourself:  torchrun --nproc_per_node 2 train.py
(written by `ft-regress init`: put your own script in its place, and name it in repro.yaml).
It builds a tiny Qwen2 with random weights (no download), so it runs on a CPU in seconds.
"""

import argparse

import deepspeed
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--zero-stage", type=int, default=3)
    parser.add_argument("--checkpointing", choices=["non-reentrant", "reentrant", "off"], default="non-reentrant")
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    # A tiny model with random weights: no download. Put your own model here.
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    if args.checkpointing != "off":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": args.checkpointing == "reentrant"}
        )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": args.zero_stage},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    generator = torch.Generator().manual_seed(dist.get_rank())
    batch = torch.randint(0, config.vocab_size, (2, 16), generator=generator).to(engine.device)
    for step in range(args.steps):
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
