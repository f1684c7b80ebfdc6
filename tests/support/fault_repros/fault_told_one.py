"""FAULT-TOLD-ONE: a user's script whose own settings (its declared ``env``) tell every rank it is rank
0 of a world of 1, whatever it was launched as: the record says the world the ranks ran in."""

REPRO = {
    "id": "FAULT-TOLD-ONE",
    "env": {"WORLD_SIZE": "1", "RANK": "0"},
    "fails_with": {"type": "RuntimeError", "pattern": "never raised"},
}

if __name__ == "__main__":
    import os

    print(f"told: rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}")
