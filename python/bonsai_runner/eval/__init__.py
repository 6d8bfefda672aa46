"""Quality tools: perplexity and KL-divergence (perplexity.py), the quality gates of `bonsai compare`
(compare.py) and the side-by-side prompt suite of `bonsai eval-prompts` (prompts.py)."""
