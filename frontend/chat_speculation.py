"""API speculative execution on chat models (SGLang's `num_api_spec_tokens` with a chat backend).

A chat API writes whole assistant messages, so inside an assistant role the texts and gens are
not run one by one: they are recorded as a template (`"Name:" gen "\\nJob:" gen`), and when
the role ends one request of `num_api_spec_tokens` tokens writes the message. The answer must
follow the template: each constant text where it stands, each gen's value up to its first stop
string (or up to the constant text after it; the last gen takes the rest). An answer that does
not is asked for again, up to `SPEC_TRIES` times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from radixflow.frontend.ir import GenArgs

SPEC_TRIES = 3  # requests per assistant message before its template counts as not followed


@dataclass
class _Term:
    name: str | None  # a gen's variable; None for constant text (and for an unnamed gen)
    text: str = ""  # constant text
    stops: list[str] = field(default_factory=list)
    is_gen: bool = False


@dataclass
class ChatSpeculation:
    """The assistant message being recorded: its constant texts and gens, in order."""

    num_tokens: int
    terms: list[_Term] = field(default_factory=list)
    args: GenArgs | None = None  # the first gen's, which every later gen must share

    @property
    def has_gens(self) -> bool:
        return any(t.is_gen for t in self.terms)

    @property
    def layout(self) -> str:
        """The template as text, gens shown as {name}, for error messages."""
        return "".join(f"{{{t.name or 'gen'}}}" if t.is_gen else t.text for t in self.terms)

    def add_text(self, text: str) -> None:
        if not text:
            return
        if self.terms and not self.terms[-1].is_gen:
            self.terms[-1].text += text
        else:
            self.terms.append(_Term(None, text))

    def add_gen(self, name: str | None, args: GenArgs) -> None:
        if args.n not in (None, 1):
            raise ValueError("gen with n > 1 cannot run under num_api_spec_tokens")
        shared = dataclasses.replace(args, max_new_tokens=None, stop=None)
        if self.args is None:
            self.args = shared
        elif shared != self.args:
            raise ValueError(
                f"gen {name!r}: the gens of one speculated assistant message share one request, "
                f"so their sampling parameters (all but max_tokens and stop) must be the same"
            )
        if self.terms and self.terms[-1].is_gen and not self.terms[-1].stops:
            raise ValueError(
                f"gen {name!r} follows gen {self.terms[-1].name!r} directly, which has no stop "
                "string: under num_api_spec_tokens the first would take the whole answer"
            )
        stops = [args.stop] if isinstance(args.stop, str) else list(args.stop or [])
        self.terms.append(_Term(name, stops=stops, is_gen=True))

    def request_args(self) -> GenArgs:
        """The one request for the message: num_tokens tokens, no stop strings."""
        assert self.args is not None
        return dataclasses.replace(self.args, max_new_tokens=self.num_tokens, stop=None)

    def match(self, answer: str) -> list[tuple[str | None, str]] | None:
        """(variable or None, text) per term when `answer` follows the template, else None.
        Text after the last term is dropped, as speculated text no gen asks for."""
        out: list[tuple[str | None, str]] = []
        rest = answer
        for i, term in enumerate(self.terms):
            if not term.is_gen:
                if not rest.startswith(term.text):
                    return None
                out.append((None, term.text))
                rest = rest[len(term.text) :]
                continue
            after = self.terms[i + 1] if i + 1 < len(self.terms) else None
            ends = term.stops or ([after.text] if after is not None else [])
            found = [p for p in (rest.find(e) for e in ends) if p >= 0]
            if found:
                end = min(found)
            elif after is None:
                end = len(rest)
            else:
                return None
            out.append((term.name, rest[:end]))
            rest = rest[end:]
        return out
