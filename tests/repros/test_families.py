"""The model families: the contract table, the per-family LoRA target resolution and its no-match check,
and the guards that look at the family (torch-free: pure functions of names)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from packaging.version import Version

from repros.runtime.families import DEFAULT_FAMILY, FAMILIES, current_family, use_family
from repros.trainer.grid_axes import DECODER_LINEARS
from repros.trainer.guards import Guard, apply_guards, choose_guards
from repros.trainer.scenario import Scenario
from repros.trainer.silent_failures import (
    TargetModulesMatchNothing,
    VisionAdaptersGotNoGradient,
    raise_if_vision_adapters_got_no_gradient,
)
from repros.trainer.targets import family_target_names, resolution_changes, resolve_targets


@pytest.fixture(autouse=True)
def default_family_after() -> Iterator[None]:
    """``use_family`` sets a process-wide family: every test leaves the default behind."""
    yield
    use_family(DEFAULT_FAMILY)


def _layer(prefix: str, names: tuple[str, ...]) -> list[str]:
    return [f"{prefix}.{n}" for n in names]


#: Module names as ``named_modules`` gives them (two decoder layers), per family shape.
LLAMA_LIKE = [
    name
    for i in range(2)
    for name in _layer(f"model.layers.{i}", ("self_attn", "mlp"))
    + _layer(f"model.layers.{i}.self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"))
    + _layer(f"model.layers.{i}.mlp", ("gate_proj", "up_proj", "down_proj"))
] + ["lm_head"]
PHI3 = [
    name
    for i in range(2)
    for name in _layer(f"model.layers.{i}.self_attn", ("qkv_proj", "o_proj"))
    + _layer(f"model.layers.{i}.mlp", ("gate_up_proj", "down_proj"))
] + ["lm_head"]
LLAVA = (
    [
        name
        for i in range(2)
        for name in _layer(
            f"model.vision_tower.encoder.layers.{i}.self_attn", ("q_proj", "k_proj", "v_proj", "out_proj")
        )
        + _layer(f"model.vision_tower.encoder.layers.{i}.mlp", ("fc1", "fc2"))
    ]
    + ["model.multi_modal_projector.linear_1", "model.multi_modal_projector.linear_2"]
    + [name.replace("model.layers", "model.language_model.layers") for name in LLAMA_LIKE if name != "lm_head"]
    + ["lm_head"]
)


def test_every_family_is_complete() -> None:
    assert DEFAULT_FAMILY in FAMILIES
    for name, family in FAMILIES.items():
        assert family.name == name
        assert Version(family.min_transformers) >= Version("4.28.0")
        assert all(old and new and old != new for old, new in family.fused_targets)
        assert family.model_class and family.traits
    assert FAMILIES["gemma2"].tied_embeddings and FAMILIES["gemma2"].attn_implementation == "eager"
    assert FAMILIES["phi3"].fused_projections and FAMILIES["qwen2-moe"].moe and FAMILIES["llava"].vision
    assert [f.name for f in FAMILIES.values() if f.fused_projections] == ["phi3"]
    assert FAMILIES["phi3"].target_name("v_proj") == "qkv_proj" and FAMILIES["phi3"].target_name("o_proj") == "o_proj"


def test_use_family_rejects_an_unknown_name_naming_the_known_ones() -> None:
    with pytest.raises(ValueError) as raised:
        use_family("gpt2")
    for known in FAMILIES:
        assert known in str(raised.value)
    assert current_family().name == DEFAULT_FAMILY


def test_use_family_sets_what_a_scenario_without_a_family_trains() -> None:
    use_family("phi3")
    assert Scenario().model_family().name == "phi3"
    assert Scenario(family="llava").model_family().name == "llava"
    with pytest.raises(ValueError, match="unknown family"):
        Scenario(family="gpt2")


def test_names_as_written_pass_where_each_matches() -> None:
    qwen2 = FAMILIES["qwen2"]
    assert resolve_targets(qwen2, ("q_proj", "v_proj"), LLAMA_LIKE, per_family=False) == ["q_proj", "v_proj"]
    assert resolve_targets(qwen2, DECODER_LINEARS, LLAMA_LIKE, per_family=True) == list(DECODER_LINEARS)
    assert not resolution_changes(qwen2, ("q_proj", "v_proj"))


def test_phi3_query_and_value_live_in_the_fused_projection() -> None:
    phi3 = FAMILIES["phi3"]
    assert family_target_names(phi3, ("q_proj", "v_proj")) == ("qkv_proj",)
    assert resolve_targets(phi3, ("q_proj", "v_proj"), PHI3, per_family=True) == ["qkv_proj"]
    assert resolve_targets(phi3, DECODER_LINEARS, PHI3, per_family=True) == [
        "qkv_proj",
        "o_proj",
        "gate_up_proj",
        "down_proj",
    ]
    assert resolution_changes(phi3, ("q_proj", "v_proj"))
    assert not resolution_changes(phi3, ("qkv_proj",))


def test_a_name_matching_nothing_is_an_error_naming_family_names_and_the_linear_layers() -> None:
    phi3 = FAMILIES["phi3"]
    # As written: PEFT would adapt o_proj and down_proj alone and say nothing.
    with pytest.raises(TargetModulesMatchNothing) as raised:
        resolve_targets(phi3, DECODER_LINEARS, PHI3, per_family=False)
    text = str(raised.value)
    assert "phi3" in text and "Phi3ForCausalLM" in text
    assert "['q_proj', 'k_proj', 'v_proj', 'gate_proj', 'up_proj']" in text
    assert "['down_proj', 'gate_up_proj', 'lm_head', 'o_proj', 'qkv_proj']" in text
    assert isinstance(raised.value, ValueError)


def test_a_vlm_targets_its_language_model_only() -> None:
    llava = FAMILIES["llava"]
    # As written the names reach the frozen CLIP tower too (no error: each matches something).
    assert resolve_targets(llava, ("q_proj", "v_proj"), LLAVA, per_family=False) == ["q_proj", "v_proj"]
    resolved = resolve_targets(llava, ("q_proj", "v_proj"), LLAVA, per_family=True)
    assert resolved == [
        f"model.language_model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")
    ]
    assert resolution_changes(llava, ("q_proj", "v_proj"))
    # A name only the vision tower has matches nothing of the language model.
    with pytest.raises(TargetModulesMatchNothing, match="language model of the llava model"):
        resolve_targets(llava, ("q_proj", "fc1"), LLAVA, per_family=True)


def test_vision_adapters_that_never_got_a_gradient_are_f23s_silent_form() -> None:
    tower = "base_model.model.model.vision_tower.encoder.layers.{}.self_attn.q_proj.lora_A.default.weight"
    language = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight"
    trained = {tower.format(0): [0.1, 0.2], language: [0.3, 0.1]}
    raise_if_vision_adapters_got_no_gradient({"adapter_grad_norms": trained})  # every adapter trained
    # DeepSpeed reports an unused parameter's gradient as zero, FSDP2 as none: both are no gradient.
    for unused in ([0.0, 0.0], [None, None]):
        with pytest.raises(VisionAdaptersGotNoGradient, match=r"^vision adapters got no gradient: 1 of 3"):
            raise_if_vision_adapters_got_no_gradient({"adapter_grad_norms": {**trained, tower.format(1): unused}})
    # The language model's own adapters are not this check's (F5's silent form looks at them).
    raise_if_vision_adapters_got_no_gradient({"adapter_grad_norms": {language: [None, None]}})


def test_the_family_target_guard_applies_where_the_names_need_resolving() -> None:
    v = {"deepspeed": Version("0.19.8"), "transformers": Version("5.23.0")}
    phi3 = Scenario(family="phi3", gradient_checkpointing=False)
    guards = choose_guards(phi3, v)
    assert [g.id for g in guards] == ["family-target-modules"]
    assert apply_guards(phi3, guards).family_targets is True
    assert choose_guards(Scenario(family="llama", gradient_checkpointing=False), v) == []
    # The item's family when the scenario names none.
    use_family("llava")
    assert [g.id for g in choose_guards(Scenario(gradient_checkpointing=False), v)] == ["family-target-modules"]


def test_the_moe_leaf_guard_applies_to_an_moe_family_where_deepspeed_does_not_mark_it() -> None:
    old = {"deepspeed": Version("0.17.6"), "transformers": Version("4.57.6")}
    moe = Scenario(family="qwen2-moe", gradient_checkpointing=False)
    assert "zero3-moe-leaf-modules" in [g.id for g in choose_guards(moe, old)]
    assert apply_guards(moe, [Guard("zero3-moe-leaf-modules", "")]).zero3_moe_leaf_modules
    new = {"deepspeed": Version("0.18.0"), "transformers": Version("4.57.6")}
    assert "zero3-moe-leaf-modules" not in [g.id for g in choose_guards(moe, new)]
    dense = Scenario(family="llama", gradient_checkpointing=False)
    assert "zero3-moe-leaf-modules" not in [g.id for g in choose_guards(dense, old)]


def test_a_peft_list_of_which_nothing_matches_is_left_to_peft_and_a_partial_one_is_refused() -> None:
    phi3 = FAMILIES["phi3"]
    # PEFT refuses this list itself (NoMatchingPeftModuleError): its own error is what users meet.
    assert resolve_targets(phi3, ("q_proj", "v_proj"), PHI3, per_family=False, library_refuses_total_miss=True) == [
        "q_proj",
        "v_proj",
    ]
    # A list PEFT would take silently (o_proj and down_proj match, the rest nothing) is refused all the same.
    with pytest.raises(TargetModulesMatchNothing, match="phi3"):
        resolve_targets(phi3, DECODER_LINEARS, PHI3, per_family=False, library_refuses_total_miss=True)
    # Where no library refuses it (DeepSpeed-Chat's own LoRA), a list that matches nothing is refused here.
    with pytest.raises(TargetModulesMatchNothing, match="phi3"):
        resolve_targets(phi3, ("q_proj", "v_proj"), PHI3, per_family=False)


def test_a_vlms_vocabulary_is_its_text_configs() -> None:
    from types import SimpleNamespace

    from repros.trainer.resize_check import config_vocab_size

    text = SimpleNamespace(vocab_size=136)
    llava = SimpleNamespace(get_text_config=lambda: text)  # transformers 5's LlavaConfig: no vocab_size of its own
    assert config_vocab_size(llava) == 136
    causal = SimpleNamespace(vocab_size=128)
    causal.get_text_config = lambda: causal  # a text model's text config is itself
    assert config_vocab_size(causal) == 128
    assert config_vocab_size(SimpleNamespace(vocab_size=64)) == 64  # a transformers without get_text_config
