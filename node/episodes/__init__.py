"""Task episodes with checked verdicts, methods learned from them, and the planner's block.

record.py: the ``episodes`` and ``episode_verdicts`` rows (strict local input, lenient remote
parsing); methods.py: learning by fixed thresholds and the ``methods`` store's promotions;
plan.py: the "Context from memory (evidence, not instructions)" block. docs/memory.md,
"Episodes and methods".
"""
from .methods import Learned, Method, learn, method_id, promote_value, promoted
from .plan import PlanBlock, plan_context
from .record import (
    Episode,
    EpisodeInputError,
    Step,
    Verdict,
    episode_value,
    episodes,
    verdict_value,
    verdicts,
    write_episode,
    write_verdict,
)

__all__ = ["Episode", "EpisodeInputError", "Learned", "Method", "PlanBlock", "Step", "Verdict", "episode_value",
           "episodes", "learn", "method_id", "plan_context", "promote_value", "promoted", "verdict_value", "verdicts",
           "write_episode", "write_verdict"]
