"""JSON extraction: pull structured fields out of free text, constrained by a JSON Schema."""

import json

import radixflow as rf

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

TEXTS = [
    "Maria Lopez is a 34-year-old architect who lives in Madrid.",
    "At 27, Tom Becker moved to Berlin to work as a chef.",
    "Yuki Tanaka, aged 45, teaches mathematics in Osaka.",
]


@rf.function
def extract(s, text):
    s += rf.system("You extract facts from text as JSON.")
    s += rf.user(f"Text: {text}\nGive the person's name, age and city as JSON.")
    s += rf.assistant(rf.gen("json", max_tokens=64, json_schema=json.dumps(SCHEMA)))


def main() -> None:
    runtime = rf.Runtime()
    rf.set_default_backend(runtime)
    states = extract.run_batch([{"text": t} for t in TEXTS], temperature=0)
    for text, state in zip(TEXTS, states, strict=True):
        print(f"text: {text}\njson: {state['json']}")
        try:
            data = json.loads(state["json"])
            missing = [k for k in SCHEMA["required"] if k not in data]
            print(f"      parsed, missing fields: {missing or 'none'}\n")
        except json.JSONDecodeError as exc:
            print(f"      not valid JSON ({exc})\n")

    runtime.shutdown()


if __name__ == "__main__":
    main()
