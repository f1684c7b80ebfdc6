"""The stacks the catalog's expectations were established on (``Expectation.under``), as the cells of the
runs that established them installed them: matrix.yaml's defaults of 2026-11 (torch 2.13.0 CPU builds), with
the packages a cell changed. They are facts about past runs, kept here as they were when matrix.yaml moves on;
the compatibility atlas (``ft-regress atlas``) holds a stack to one of them in every package a failure depends
on that the expectation's ``when`` does not name. Not a repro: discovery skips modules named ``_*``.
"""

from __future__ import annotations

#: matrix.yaml's defaults when the catalog's expectations were established (2026-11-22 .. 2026-11-27).
DEFAULTS_2026_11: dict[str, str] = {
    "torch": "==2.13.0",
    "deepspeed": "==0.19.8",
    "peft": "==0.21.2",
    "transformers": "==5.23.0",
    "accelerate": "==1.15.0",
    "bitsandbytes": "==0.50.2",
}


def stack(**changed: str | None) -> dict[str, str]:
    """The 2026-11 defaults with some packages at other releases (``stack(transformers="4.57.6")``, a cell's
    changes); ``None`` leaves a package out (a cell without it)."""
    pins = dict(DEFAULTS_2026_11)
    for name, version in changed.items():
        if version is None:
            pins.pop(name, None)
        else:
            pins[name] = f"=={version}"
    return pins


#: The ci lane's ``current`` cell (and ``current-new-paths``, ``current-cuda-only``: its environment).
CURRENT = stack()
#: ``tf4``: late transformers 4.x.
TF4 = stack(transformers="4.57.6")
#: ``tf4-ds-0.18.0``.
TF4_DS_0_18 = stack(transformers="4.57.6", deepspeed="0.18.0")
#: ``torch-2.12-tf4`` (a CUDA build of torch 2.12.1, run on a CPU).
TORCH_2_12_TF4 = stack(torch="2.12.1", transformers="4.57.6")
#: ``torch-2.0-tf4.40``: torch 2.0 and the libraries of its time, without DeepSpeed and bitsandbytes.
TORCH_2_0_TF4_40 = stack(
    torch="2.0.1", transformers="4.40.2", peft="0.10.0", accelerate="0.29.3", deepspeed=None, bitsandbytes=None
)
#: ``ds-0.19.2``: DeepSpeed before PR #8148 on the current stack.
DS_0_19_2 = stack(deepspeed="0.19.2")
#: ``tf4-peft-0.15.0``.
TF4_PEFT_0_15_0 = stack(transformers="4.57.6", peft="0.15.0")
#: ``tf-4.43.0`` (and ``tf-4.43.4``, the same with its transformers): the libraries of transformers 4.43's time.
TF_4_43 = stack(transformers="4.43.0", peft="0.11.1", accelerate="0.31.0")
#: ``tf4-ds-0.17.6``.
TF4_DS_0_17 = stack(transformers="4.57.6", deepspeed="0.17.6")
#: ``torch-2.11-acc-1.13`` (a CUDA build of torch 2.11.0, run on a CPU).
TORCH_2_11_ACC_1_13 = stack(torch="2.11.0", accelerate="1.13.0")
#: ``tf-5.5.3-trl``: TRL 1.1.0 with the kernels package (and requests, which trl 1.1.0 imports undeclared).
TRL_TF_5_5_3 = stack(transformers="5.5.3", trl="1.1.0", kernels="0.13.0")
#: ``tf4-accelerate-1.7.0``.
TF4_ACC_1_7 = stack(transformers="4.57.6", accelerate="1.7.0")
#: ``sp-ds-0.18.1``: DeepSpeed 0.18.1 for Ulysses sequence parallelism (F26, F27).
SP_DS_0_18_1 = stack(deepspeed="0.18.1")
#: ``sp-ds-0.18.3``: DeepSpeed 0.18.3, the last before PR #7737 (F26) and after PR #7649 (F27).
SP_DS_0_18_3 = stack(deepspeed="0.18.3")
#: ``peft-0.20.0``: peft before PR #3576 (F29).
PEFT_0_20_0 = stack(peft="0.20.0")
#: ``torchao-peft-0.18.1``: peft 0.18.1 beside torchao 0.18.0 (F30).
TORCHAO_PEFT_0_18_1 = stack(peft="0.18.1", torchao="0.18.0")
#: ``torchao-0.18``: the current releases beside torchao 0.18.0 (F30's clean side).
TORCHAO_0_18 = stack(torchao="0.18.0")
#: ``trl-1.6.0-fsdp2``: TRL 1.6.0, the last before PR #6065 (F31).
TRL_1_6_0_FSDP2 = stack(trl="1.6.0")
#: ``trl-1.7.0-fsdp2``: TRL 1.7.0 (F31's clean side).
TRL_1_7_0_FSDP2 = stack(trl="1.7.0")
#: ``tf-5.0.0``: transformers 5.0.0 (F32's silent form).
TF_5_0_0 = stack(transformers="5.0.0")
#: ``tf-5.1.0``: transformers 5.1.0 (F32's conversion error).
TF_5_1_0 = stack(transformers="5.1.0")
#: ``acc-1.12-cp``: accelerate 1.12.0 (F28 on two GPUs; on a CPU accelerate refuses its ParallelismConfig).
ACC_1_12_CP = stack(accelerate="1.12.0")
