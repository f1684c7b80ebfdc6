"""Which modules a LoRA targets in each model family, and the check that every name targets something.

A scenario says what users write (``Scenario.target_modules``, by default ``("q_proj", "v_proj")``: the
attention's query and value). Written for a Llama, those names mean something else, or nothing, in
another family: Phi-3 keeps query, key and value in one ``qkv_proj`` and gate and up in one
``gate_up_proj``; a LLaVA's CLIP tower has ``q_proj``/``v_proj`` of its own, so the plain names also put
adapters on the frozen vision tower. The fixed trainer's ``family-target-modules`` guard
(``Scenario.family_targets``) resolves them per family (``family_target_names``, by the family's own
``Family.fused_targets``; for a VLM, the language model's full module names only); the ``bug`` mode keeps
the user's names.

In both modes every name must match at least one module (``resolve_targets``): PEFT raises ("Target
modules ... not found in the base model") only when no name matches at all, and is silent when some do;
a name that matches nothing is ``TargetModulesMatchNothing``. A PEFT list as written of which no
name matches is left to PEFT's own refusal (``model.target_modules_for``): the error users meet.
Standard library only: pure functions of module names, so the orchestrator's tests can check them
without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from repros.runtime.families import Family
from repros.trainer.silent_failures import TargetModulesMatchNothing, in_vision_tower


def matches(module_name: str, target: str) -> bool:
    """PEFT's rule for a name in a ``target_modules`` list: the module's full name or its dotted suffix."""
    return module_name == target or module_name.endswith("." + target)


def family_target_names(family: Family, requested: Sequence[str]) -> tuple[str, ...]:
    """``requested`` with each name mapped to where it lives in ``family`` (Phi-3's fused projections),
    each once, in order."""
    names = [family.target_name(n) for n in requested]
    return tuple(dict.fromkeys(names))


def resolution_changes(family: Family, requested: Sequence[str]) -> bool:
    """Whether resolving ``requested`` for ``family`` targets other modules than the names as written
    (what the ``family-target-modules`` guard looks at)."""
    return family.vision or family_target_names(family, requested) != tuple(requested)


def resolve_targets(
    family: Family,
    requested: Sequence[str],
    module_names: Sequence[str],
    *,
    per_family: bool,
    linear_names: Sequence[str] | None = None,
    library_refuses_total_miss: bool = False,
) -> list[str]:
    """The ``target_modules`` the adapter gets: ``requested`` as written, or (``per_family``) resolved for
    ``family`` (a VLM: the full names of its language model's matching modules). Raises
    ``TargetModulesMatchNothing`` naming the family, the names that match no module of ``module_names``
    (the model's, as ``named_modules`` gives them; a VLM resolved: of its language model), and the
    model's linear layers (``linear_names``, default ``module_names``) by their last name component.
    With ``library_refuses_total_miss`` (PEFT), a list as written of which no name matches at all is
    returned as it is: the library refuses it itself, and its own error is what users meet."""
    names = list(family_target_names(family, requested) if per_family else dict.fromkeys(requested))
    language_only = per_family and family.vision
    candidates = [m for m in module_names if not (language_only and in_vision_tower(m))]
    unmatched = [n for n in names if not any(matches(m, n) for m in candidates)]
    if library_refuses_total_miss and not per_family and len(unmatched) == len(names):
        return names
    if unmatched:
        linears = sorted({m.rsplit(".", 1)[-1] for m in (module_names if linear_names is None else linear_names) if m})
        where = "the language model of " if language_only else ""
        raise TargetModulesMatchNothing(
            f"LoRA target modules {unmatched} match no module of {where}the {family.name} model "
            f"({family.model_class}); its linear layers: {linears}"
        )
    if language_only:
        return [m for m in candidates if any(matches(m, n) for n in names)]
    return names
