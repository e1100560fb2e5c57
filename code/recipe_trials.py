"""The recipe search's design (the Performance page): where it starts (START, the quick
profile changed), what each trial changes (TRIALS), and the CPU minutes of each rung
(BUDGETS_MINUTES). code/recipe_search.py runs it."""

import profiles

# where the search starts: a 3-layer model of width 256, Eq. (3) peaking near 1e-3
START = profiles.apply_changes(
    profiles.PROFILES["quick"],
    {
        "N": 3,
        "h": 8,
        "d_ff": 512,
        "warmup_steps": 400,
        "lr_factor": 0.33,
        "eval_every": 250,
        "checkpoint_every": 250,
        "bleu_sentences": 500,
        "log_every": 50,
        "max_steps": 250,
    },
)
TRIALS = {
    "start": {},
    "lr x2": {"lr_factor": 0.66},
    "warmup 1000": {"warmup_steps": 1000, "lr_factor": 0.52},  # the same peak, reached later
    "dropout 0.3": {"dropout": 0.3},
    "attention+relu dropout 0.1": {"attention_dropout": 0.1, "relu_dropout": 0.1},
    "d_ff 1024": {"d_ff": 1024},
    "N 4": {"N": 4},
    "d_model 384": {"d_model": 384, "d_ff": 768, "lr_factor": 0.4},
    "batch 4000": {"max_tokens": 4000},
    "vocab 5000": {"vocab_size": 5000},
    "smoothing 0.2": {"smoothing": 0.2},
    "weight decay 0.1": {"weight_decay": 0.1},
    # the three changes that beat "start" at rung 0, together
    "vocab 5000 + smoothing 0.2 + weight decay 0.1": {
        "vocab_size": 5000,
        "smoothing": 0.2,
        "weight_decay": 0.1,
    },
}
BUDGETS_MINUTES = (20, 60)
