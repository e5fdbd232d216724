"""Published random and human scores of the Atari-57 games, for human-normalised scores.

normalised = (score - random) / (human - random): 0 is a uniformly random agent, 1 a
professional human game tester. The figures are those of the DQN line of work: Mnih et al.,
"Human-level control through deep reinforcement learning", Nature 518 (2015), Extended Data
Table 2, completed to 57 games by Badia et al., "Agent57: Outperforming the Atari Human
Benchmark", ICML 2020, Table H.1 (the table DeepMind's dqn_zoo and rliable use). Their protocol:
each episode starts after 1-30 random no-ops, is capped at 108,000 frames (30 minutes), and is
scored to game over (not per life) with the unclipped score; rlsup's evaluation plays full
games with the unclipped score (training/evaluate.py), and envpool's Atari resets with up to
30 no-ops (`noop_max`), so its figures compare with this table.
"""

from __future__ import annotations

import re

CITATION = (
    "random/human: Mnih et al. 2015 (Nature, Ext. Data Table 2) and Badia et al. 2020 "
    "(Agent57, Table H.1); 1-30 no-op starts, 108k-frame cap, full games, unclipped score"
)

# game -> (random, human)
RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    "alien": (227.8, 7127.7),
    "amidar": (5.8, 1719.5),
    "assault": (222.4, 742.0),
    "asterix": (210.0, 8503.3),
    "asteroids": (719.1, 47388.7),
    "atlantis": (12850.0, 29028.1),
    "bankheist": (14.2, 753.1),
    "battlezone": (2360.0, 37187.5),
    "beamrider": (363.9, 16926.5),
    "berzerk": (123.7, 2630.4),
    "bowling": (23.1, 160.7),
    "boxing": (0.1, 12.1),
    "breakout": (1.7, 30.5),
    "centipede": (2090.9, 12017.0),
    "choppercommand": (811.0, 7387.8),
    "crazyclimber": (10780.5, 35829.4),
    "defender": (2874.5, 18688.9),
    "demonattack": (152.1, 1971.0),
    "doubledunk": (-18.6, -16.4),
    "enduro": (0.0, 860.5),
    "fishingderby": (-91.7, -38.7),
    "freeway": (0.0, 29.6),
    "frostbite": (65.2, 4334.7),
    "gopher": (257.6, 2412.5),
    "gravitar": (173.0, 3351.4),
    "hero": (1027.0, 30826.4),
    "icehockey": (-11.2, 0.9),
    "jamesbond": (29.0, 302.8),
    "kangaroo": (52.0, 3035.0),
    "krull": (1598.0, 2665.5),
    "kungfumaster": (258.5, 22736.3),
    "montezumarevenge": (0.0, 4753.3),
    "mspacman": (307.3, 6951.6),
    "namethisgame": (2292.3, 8049.0),
    "phoenix": (761.4, 7242.6),
    "pitfall": (-229.4, 6463.7),
    "pong": (-20.7, 14.6),
    "privateeye": (24.9, 69571.3),
    "qbert": (163.9, 13455.0),
    "riverraid": (1338.5, 17118.0),
    "roadrunner": (11.5, 7845.0),
    "robotank": (2.2, 11.9),
    "seaquest": (68.4, 42054.7),
    "skiing": (-17098.1, -4336.9),
    "solaris": (1236.3, 12326.7),
    "spaceinvaders": (148.0, 1668.7),
    "stargunner": (664.0, 10250.0),
    "surround": (-10.0, 6.5),
    "tennis": (-23.8, -8.3),
    "timepilot": (3568.0, 5229.2),
    "tutankham": (11.4, 167.6),
    "upndown": (533.4, 11693.2),
    "venture": (0.0, 1187.5),
    "videopinball": (16256.9, 17667.9),
    "wizardofwor": (563.5, 4756.5),
    "yarsrevenge": (3092.9, 54576.9),
    "zaxxon": (32.5, 9173.3),
}


def table_key(env_id: str) -> str | None:
    """The table's key of an envpool task id (`MontezumaRevenge-v5` -> "montezumarevenge"),
    or None for a task that is not an Atari-57 game."""
    key = re.sub(r"[^a-z0-9]", "", re.sub(r"-v\d+$", "", env_id).lower())
    return key if key in RANDOM_HUMAN else None


def normalised(env_id: str, score: float) -> float | None:
    """The human-normalised score of `score` on `env_id` (None: not in the table)."""
    key = table_key(env_id)
    if key is None:
        return None
    random, human = RANDOM_HUMAN[key]
    return (score - random) / (human - random)
