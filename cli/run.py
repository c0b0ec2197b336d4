"""`ortllm run MODEL [PROMPT]`: chat with a model in the terminal, like `ollama run`, on the Engine in-process.

    ortllm run smollm2-135m-instruct:int4              an interactive session: history, streamed replies
    ortllm run DIR "Why is the sky blue?"              one reply, then exit (the prompt from stdin if piped)

In a session: `/set temperature 0.2` (any `ChatOptions` field; `/set` alone lists them), `/show`, `/history`,
`/clear` (forget the history), `/bye` or Ctrl-D to leave, `\"\"\"` to start and end a multi-line message. Ctrl-C
stops a reply (what came so far stays in the history) and never the session.
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass

from pathlib import Path

from ortllm.protocol.harmony import HarmonyReply
from ortllm.runtime.errors import OrtllmError
from ortllm.runtime.sampling_params import SamplingParams

from .options import Option, add_options, declares, fill_defaults

PROMPT, MORE = ">>> ", "... "
FENCE = '"""'
HELP = ('commands: /set KEY VALUE (e.g. /set temperature 0.2; /set alone lists the keys), /show, /history, /clear, '
        f'/bye; {FENCE} starts and ends a multi-line message; Ctrl-C stops a reply, Ctrl-D leaves')


@dataclass
class ChatOptions:
    """What `ortllm run` samples with: its flags' defaults and the keys of /set."""
    system: str | None = None           # system message of the conversation
    adapter: str | None = None          # LoRA adapter of the artifact (ortllm adapters list)
    temperature: float = 0.8            # 0: greedy
    top_p: float = 0.95                 # 1: off
    top_k: int = 0                      # 0: off
    min_p: float = 0.0                  # 0: off
    repetition_penalty: float = 1.0     # 1: off
    max_tokens: int = 1024              # per reply (capped to the room the context leaves)
    seed: int | None = None             # same seed, same reply

    def params(self) -> SamplingParams:
        keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed", "adapter")
        return SamplingParams(**{k: getattr(self, k) for k in keys}).validate()

    def set(self, key: str, text: str) -> None:
        """/set KEY VALUE: parsed by the field's type, checked as SamplingParams; nothing changes on an error."""
        hints = typing.get_type_hints(ChatOptions)
        if key not in hints:
            raise OrtllmError(f"unknown setting {key!r}; settings: {', '.join(hints)}")
        kind = [t for t in typing.get_args(hints[key]) if t is not type(None)] or [hints[key]]
        if text.lower() in ("none", "off", "") and type(None) in typing.get_args(hints[key]):
            value = None
        else:
            try:
                value = kind[0](text)
            except ValueError:
                raise OrtllmError(f"{key} takes a {kind[0].__name__}; got {text!r}") from None
        old = getattr(self, key)
        setattr(self, key, value)
        try:
            self.params()
        except OrtllmError:
            setattr(self, key, old)
            raise


class Chat:
    """One conversation on an engine: the history, and a reply streamed to `out`."""

    def __init__(self, engine, options: ChatOptions, out=None):
        self.engine, self.options, self.out = engine, options, sys.stdout if out is None else out   # at call time
        self.history: list[dict] = []

    def prompt_ids(self, text: str) -> list[int]:
        tok = self.engine.tokenizer
        system = [{"role": "system", "content": self.options.system}] if self.options.system else []
        messages = system + self.history + [{"role": "user", "content": text}]
        if tok.chat_template:
            return tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        # a base model without a chat template: the turns as plain text
        plain = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return tok.encode(plain, add_special_tokens=True)

    def reply(self, text: str) -> str:
        """Stream the model's answer to `text`; Ctrl-C stops it (the part so far is kept). Returns the answer.
        A harmony model (gpt-oss): its reasoning is shown between "Thinking..." and "...done thinking." (as
        `ollama run` shows it) and the history keeps the final answer alone (harmony drops answered reasoning)."""
        handle = self.engine.submit(self.prompt_ids(text), self.options.params())
        reader = HarmonyReply() if self.engine.tokenizer.harmony else None
        answer, thinking = "", False
        try:
            for delta in handle:
                for d in reader.feed(delta) if reader is not None else [{"content": delta}]:
                    thinking = self._write(d, thinking)
                    answer += d.get("content", "")
            for d in reader.finish() if reader is not None else []:
                thinking = self._write(d, thinking)
                answer += d.get("content", "")
        except KeyboardInterrupt:
            handle.cancel()
            self.out.write(" [stopped]")
        self.out.write("\n")
        self.out.flush()
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        return answer

    def _write(self, d: dict, thinking: bool) -> bool:
        """One delta of the reply to the terminal; whether reasoning is being shown after it."""
        if d.get("reasoning_content"):
            self.out.write(("" if thinking else "Thinking...\n") + d["reasoning_content"])
            thinking = True
        if d.get("content"):
            self.out.write(("\n...done thinking.\n\n" if thinking else "") + d["content"])
            thinking = False
        self.out.flush()
        return thinking


def read_message(read=input) -> str | None:
    """One message from the terminal: a line, or the lines between two \"\"\" fences. None at Ctrl-D."""
    try:
        line = read(PROMPT)
    except EOFError:
        return None
    if not line.lstrip().startswith(FENCE):
        return line
    lines = [line.lstrip()[len(FENCE):]]
    while FENCE not in lines[-1]:
        try:
            lines.append(read(MORE))
        except EOFError:
            break
    text = "\n".join(lines)
    return (text[:text.rindex(FENCE)] if FENCE in text else text).strip("\n")


def command(chat: Chat, line: str, out) -> bool:
    """A /command; False when it ends the session."""
    word, _, rest = line.strip().partition(" ")
    if word in ("/bye", "/exit", "/quit"):
        return False
    if word == "/set":
        key, _, value = rest.strip().partition(" ")
        if not key:
            out.write("settings: " + ", ".join(f.name for f in dataclasses.fields(ChatOptions)) + "\n")
        else:
            try:
                chat.options.set(key, value.strip())
                out.write(f"set {key} = {getattr(chat.options, key)!r}\n")
            except OrtllmError as e:
                out.write(f"error: {e}\n")
    elif word == "/show":
        for f in dataclasses.fields(ChatOptions):
            out.write(f"{f.name} = {getattr(chat.options, f.name)!r}\n")
    elif word == "/history":
        for m in chat.history:
            out.write(f"{m['role']}: {m['content']}\n")
    elif word == "/clear":
        chat.history.clear()
        out.write("history cleared\n")
    else:
        out.write(HELP + "\n")
    return True


def interactive(chat: Chat, out=None, read=input) -> None:
    out = sys.stdout if out is None else out     # the stream of the call, not the one of the import
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    out.write(f"ortllm: chatting with {chat.engine.artifact.manifest.recipe or chat.engine.artifact.path.name}; "
              "/? for help, /bye to leave\n")
    while True:
        try:
            text = read_message(read)
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /bye to leave)\n")
            continue
        if text is None:
            out.write("\n")
            return
        if not text.strip():
            continue
        if text.startswith("/") and not text.startswith(FENCE):
            if not command(chat, text, out):
                return
            continue
        try:
            chat.reply(text)
            out.write("\n")
        except KeyboardInterrupt:           # before the first token (while the prompt was being sent)
            out.write(" [stopped]\n\n")
        except OrtllmError as e:
            out.write(f"error: {e}\n")


def run_chat(artifact, prompt: str | None, options: ChatOptions, threads: int | None = None,
             stdin=None, out=None) -> int:
    """stdin, out: None for sys.stdin, sys.stdout as they are when called (a caller's redirection holds)."""
    from ortllm.runtime.artifact import load_artifact
    from ortllm.runtime.engine import Engine

    stdin, out = sys.stdin if stdin is None else stdin, sys.stdout if out is None else out

    if load_artifact(artifact, verify=False).graph != "engine":
        raise OrtllmError(f"{artifact} is a portable artifact; ortllm run needs an engine artifact (ortllm build "
                          "--graph engine), or use ortllm generate")
    if prompt is None and not stdin.isatty():
        prompt = stdin.read()
    options.params()                                # bad flags fail before the model loads
    with Engine.from_artifact(artifact, **({"threads": threads} if threads else {})) as engine:
        chat = Chat(engine, options, out)
        if prompt is not None:
            if not prompt.strip():
                raise OrtllmError("the prompt is empty; pass some text, or no prompt for a session")
            chat.reply(prompt.strip())
            return 0
        interactive(chat, out)
    return 0


RUN_OPTIONS = tuple(Option("--" + name.replace("_", "-"), doc, lambda: ChatOptions, metavar=meta)
                    for name, doc, meta in (
    ("system", "system message of the conversation", "TEXT"),
    ("adapter", "LoRA adapter of the artifact (ortllm adapters list)", "NAME"),
    ("temperature", "0 = greedy; /set temperature T in a session", "T"),
    ("top_p", "nucleus sampling (1: off)", "P"),
    ("top_k", "sample from the K most likely tokens (0: off)", "K"),
    ("min_p", "drop tokens below P x the most likely one's probability (0: off)", "P"),
    ("repetition_penalty", "penalty on tokens already seen (1: off)", "R"),
    ("max_tokens", "tokens per reply at most", "N"),
    ("seed", "same seed, same replies", "S"))) + (
    Option("--threads", "intra-op threads", lambda: __import__("ortllm.runtime.config", fromlist=["x"]).EngineConfig,
           default_text="physical cores", metavar="N"),)


def add_run(sub) -> None:
    p = sub.add_parser("run", help="chat with a model in the terminal (streamed, with history), or answer one "
                                   "prompt (given, or piped on stdin); in-process, no server")
    p.add_argument("artifact", type=Path, metavar="MODEL", help="artifact directory or store name (NAME[:TAG])")
    p.add_argument("prompt", nargs="?", default=None, help="answer this and exit (default: an interactive session, "
                   "or stdin when it is not a terminal)")
    if declares("run"):
        add_options(p, RUN_OPTIONS)
    p.set_defaults(run=run_run, prepare=lambda a: fill_defaults(a, RUN_OPTIONS))


def run_run(a) -> int:
    options = ChatOptions(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ChatOptions)})
    return run_chat(a.artifact, a.prompt, options, threads=a.threads)
