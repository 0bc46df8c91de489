"""ListOps (Nangia & Bowman 2018, as Long Range Arena generates it): nested list operations over digits.

An expression is a digit ``0``–``9`` or ``[OP a b ... ]`` with 2 to ``max_args`` arguments, each itself an
expression; the label is its value (0–9). The four operators:

- ``[MIN`` / ``[MAX``: the smallest / largest argument;
- ``[MED``: the median, truncated to an integer: for an even count the mean of the two middle values
  rounded down (``[MED 1 5 3 9 ]`` = (3 + 5) / 2 = 4, ``[MED 1 2 ]`` = 1), as LRA's ``int(np.median(...))``;
- ``[SM``: the sum modulo 10.

The LRA recipe, restated here in this module's own code: every node above ``max_depth`` is an operator with
probability 1/4, else a uniformly drawn digit (nodes at ``max_depth`` are digits); an operator draws its
argument count uniformly from 2..``max_args`` and its name uniformly; expressions are drawn until one has
strictly between ``min_len`` and ``max_len`` tokens (a token: a digit, an operator, or ``]``; LRA's
parentheses carry nothing and are not tokens). Each sample has its own seeded generator, so a set is a
function of (seed, split, index) and a smaller set is a prefix of a larger one.
"""
from __future__ import annotations

import random
from typing import List, Sequence, Tuple, Union

import numpy as np

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
#: token id → token; id 0 pads a sequence to the model's length
VOCAB = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + (CLOSE,)
TOKEN_IDS = {tok: i for i, tok in enumerate(VOCAB)}
PAD_ID = 0
#: LRA's recipe: depth, arguments, token-length bounds (exclusive), probability that a node is an operator
MAX_DEPTH, MAX_ARGS, MIN_LEN, MAX_LEN, OPERATOR_P = 10, 10, 500, 2000, 0.25


def apply_operator(op: str, args: Sequence[int]) -> int:
    """The value of operator ``op`` (one of :data:`OPERATORS`) on the digits ``args``."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s, n = sorted(args), len(args)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}; expected one of {', '.join(OPERATORS)}")


def evaluate(expression: Union[str, Sequence[str]]) -> int:
    """The value of a ListOps expression, e.g. ``evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]")`` = 9.

    Takes the text (tokens separated by spaces; LRA's ``(`` ``)`` are ignored) or a token list;
    ``ValueError`` names what is malformed.
    """
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    stack: List[Tuple[str, List[int]]] = []
    result = None
    for tok in tokens:
        if tok in ("(", ")", VOCAB[PAD_ID]):
            continue
        if result is not None:
            raise ValueError(f"ListOps expression continues after its end: {tok!r}")
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == CLOSE:
            if not stack or len(stack[-1][1]) < 1:
                raise ValueError("ListOps expression has ']' without an operator and arguments before it")
            op, args = stack.pop()
            value = apply_operator(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif tok.isdigit() and len(tok) == 1:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unknown ListOps token {tok!r}; expected a digit, {', '.join(OPERATORS)} or ']'")
    if stack or result is None:
        raise ValueError(f"ListOps expression is incomplete ({len(stack)} operator(s) not closed)")
    return result


def encode(tokens: Sequence[str]) -> np.ndarray:
    """Token strings → ids (uint8) in :data:`VOCAB`."""
    try:
        return np.array([TOKEN_IDS[t] for t in tokens], dtype=np.uint8)
    except KeyError as err:
        raise ValueError(f"unknown ListOps token {err.args[0]!r}; vocabulary: {' '.join(VOCAB[1:])}") from None


def decode(ids: Sequence[int]) -> str:
    """Ids → the expression text, padding dropped."""
    return " ".join(VOCAB[i] for i in ids if i != PAD_ID)


def _draw(rng: random.Random, depth: int, max_depth: int, max_args: int, out: List[str]) -> int:
    """Append one random expression's tokens to ``out``; returns its value."""
    if depth >= max_depth or rng.random() >= OPERATOR_P:
        value = rng.randrange(10)
        out.append(str(value))
        return value
    n_args = rng.randint(2, max_args)
    op = rng.choice(OPERATORS)
    out.append(op)
    values = [_draw(rng, depth + 1, max_depth, max_args, out) for _ in range(n_args)]
    out.append(CLOSE)
    return apply_operator(op, values)


def longest(max_depth: int, max_args: int) -> int:
    """The most tokens an expression can have: every node an operator with ``max_args`` arguments."""
    n = 1
    for _ in range(max_depth - 1):
        n = 2 + max_args * n
    return n


def sample(seed: str, min_len: int = MIN_LEN, max_len: int = MAX_LEN, max_depth: int = MAX_DEPTH,
           max_args: int = MAX_ARGS) -> Tuple[List[str], int]:
    """One expression (its tokens) and its value, drawn with a generator seeded by ``seed`` until its
    length is strictly between ``min_len`` and ``max_len``."""
    if not 0 <= min_len < max_len - 1:
        raise ValueError(f"ListOps lengths must satisfy 0 <= min_len < max_len - 1, got {min_len} and {max_len}")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"ListOps needs max_depth >= 1 and max_args >= 2, got {max_depth} and {max_args}")
    if longest(max_depth, max_args) <= min_len:
        raise ValueError(f"ListOps expressions of depth <= {max_depth} with <= {max_args} arguments have at most "
                         f"{longest(max_depth, max_args)} tokens, not more than min_len={min_len}")
    rng = random.Random(seed)
    while True:
        tokens: List[str] = []
        # depth 1 at the root, as in LRA: max_depth=10 allows 9 nested operators
        value = _draw(rng, 1, max_depth, max_args, tokens)
        if min_len < len(tokens) < max_len:
            return tokens, value


__all__ = ["CLOSE", "OPERATORS", "PAD_ID", "TOKEN_IDS", "VOCAB", "apply_operator", "decode", "encode", "evaluate",
           "longest", "sample"]
