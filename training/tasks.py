"""Envpool task ids a worker can train (discrete actions): Atari v5 and classic control.

Kept as data so that the supervisor validates game names without importing envpool;
tests/training/test_envpool_import.py checks it against envpool.list_all_envs().
"""

CLASSIC_TASKS = frozenset({"Acrobot-v1", "CartPole-v1", "MountainCar-v0"})
ATARI_TASKS = frozenset(
    {
        "Adventure-v5",
        "AirRaid-v5",
        "Alien-v5",
        "Amidar-v5",
        "Assault-v5",
        "Asterix-v5",
        "Asteroids-v5",
        "Atlantis-v5",
        "Atlantis2-v5",
        "Backgammon-v5",
        "BankHeist-v5",
        "BasicMath-v5",
        "BattleZone-v5",
        "BeamRider-v5",
        "Berzerk-v5",
        "Blackjack-v5",
        "Bowling-v5",
        "Boxing-v5",
        "Breakout-v5",
        "Carnival-v5",
        "Casino-v5",
        "Centipede-v5",
        "ChopperCommand-v5",
        "CrazyClimber-v5",
        "Crossbow-v5",
        "Darkchambers-v5",
        "Defender-v5",
        "DemonAttack-v5",
        "DonkeyKong-v5",
        "DoubleDunk-v5",
        "Earthworld-v5",
        "ElevatorAction-v5",
        "Enduro-v5",
        "Entombed-v5",
        "Et-v5",
        "FishingDerby-v5",
        "FlagCapture-v5",
        "Freeway-v5",
        "Frogger-v5",
        "Frostbite-v5",
        "Galaxian-v5",
        "Gopher-v5",
        "Gravitar-v5",
        "Hangman-v5",
        "HauntedHouse-v5",
        "Hero-v5",
        "HumanCannonball-v5",
        "IceHockey-v5",
        "Jamesbond-v5",
        "JourneyEscape-v5",
        "Kaboom-v5",
        "Kangaroo-v5",
        "KeystoneKapers-v5",
        "KingKong-v5",
        "Klax-v5",
        "Koolaid-v5",
        "Krull-v5",
        "KungFuMaster-v5",
        "LaserGates-v5",
        "LostLuggage-v5",
        "MarioBros-v5",
        "MiniatureGolf-v5",
        "MontezumaRevenge-v5",
        "MrDo-v5",
        "MsPacman-v5",
        "NameThisGame-v5",
        "Othello-v5",
        "Pacman-v5",
        "Phoenix-v5",
        "Pitfall-v5",
        "Pitfall2-v5",
        "Pong-v5",
        "Pooyan-v5",
        "PrivateEye-v5",
        "Qbert-v5",
        "Riverraid-v5",
        "RoadRunner-v5",
        "Robotank-v5",
        "Seaquest-v5",
        "SirLancelot-v5",
        "Skiing-v5",
        "Solaris-v5",
        "SpaceInvaders-v5",
        "SpaceWar-v5",
        "StarGunner-v5",
        "Superman-v5",
        "Surround-v5",
        "Tennis-v5",
        "Tetris-v5",
        "TicTacToe3d-v5",
        "TimePilot-v5",
        "Trondead-v5",
        "Turmoil-v5",
        "Tutankham-v5",
        "UpNDown-v5",
        "Venture-v5",
        "VideoCheckers-v5",
        "VideoChess-v5",
        "VideoCube-v5",
        "VideoPinball-v5",
        "WizardOfWor-v5",
        "WordZapper-v5",
        "YarsRevenge-v5",
        "Zaxxon-v5",
    }
)
KNOWN_TASKS = CLASSIC_TASKS | ATARI_TASKS


def suggest(name: str, n: int = 3) -> list[str]:
    """Close task ids for a misspelt one (case-insensitive)."""
    import difflib

    lowered = {t.lower(): t for t in KNOWN_TASKS}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
    return [lowered[h] for h in hits]


def is_atari(env_id: str) -> bool:
    """An Atari v5 task (frames, the conv net), as opposed to a classic-control vector task."""
    return env_id.endswith("-v5")
