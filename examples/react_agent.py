"""A ReAct agent: the model thinks, picks a Python tool with `select`, and reads its result.

Tools are plain Python functions; the loop is plain Python control flow around gen/select.
"""

import ast
import operator

import radixflow as rf

FACTS = {
    "france": "France: capital Paris, population about 68 million.",
    "japan": "Japan: capital Tokyo, population about 124 million.",
    "brazil": "Brazil: capital Brasilia, population about 203 million.",
    "egypt": "Egypt: capital Cairo, population about 105 million.",
}

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / arithmetic (no names, no calls)."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / are allowed")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


def lookup(country: str) -> str:
    """Facts about a country from a small table."""
    return FACTS.get(country.strip().strip(".").lower(), f"no entry for {country.strip()!r}")


TOOLS = {"calculator": calculator, "lookup": lookup}

PROMPT = """Answer the question using tools. Tools: lookup[country] gives facts about a country;
calculator[expression] does arithmetic. Reply with Thought, Action, Action Input lines.

Question: What is the population of Egypt times 2?
Thought: I need Egypt's population.
Action: lookup
Action Input: Egypt
Observation: Egypt: capital Cairo, population about 105 million.
Thought: Now I multiply 105 by 2.
Action: calculator
Action Input: 105 * 2
Observation: 210
Thought: I know the answer.
Action: finish
Action Input: about 210 million

"""


@rf.function
def react(s, question, max_steps=4):
    s += PROMPT + "Question: " + question + "\n"
    for _ in range(max_steps):
        s += "Thought:" + rf.gen("thought", max_tokens=24, stop="\n") + "\n"
        s += "Action: " + rf.select("action", ["lookup", "calculator", "finish"]) + "\n"
        s += "Action Input:" + rf.gen("input", max_tokens=16, stop="\n") + "\n"
        if s["action"] == "finish":
            break
        s += f"Observation: {TOOLS[s['action']](s['input'])}\n"


def main() -> None:
    runtime = rf.Runtime()
    rf.set_default_backend(runtime)
    for question in ["What is the capital of Japan?", "What is the population of Brazil plus 7?"]:
        state = react.run(question, temperature=0)
        print(state.text()[len(PROMPT) :])
        print("-" * 60)

    runtime.shutdown()


if __name__ == "__main__":
    main()
