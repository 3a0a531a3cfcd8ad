"""The FoX judge over real HTTP: a local OpenAI-compatible server, the real `openai` SDK, retries and errors."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from conftest import LocalHTTPServer

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.metrics.judge import JUDGE_SYSTEM, OpenAIJudge, judge_message, parse_rating
from evalsuite.tasks.niah import JUDGE_QUESTION, STANDARD_NEEDLE, NiahConfig, run_niah


class FakeOpenAI(LocalHTTPServer):
    """``POST /v1/chat/completions`` on 127.0.0.1: replies from a script, then a default "[[7]]" reply.

    A script step is ``(status, content, headers, delay)``: status 200 sends a chat completion whose message is
    ``content``; any other status sends an OpenAI-style error body. ``delay`` seconds pass before replying.
    """

    def __init__(self):
        self.script: list[tuple] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                    step = server.script.pop(0) if server.script else (200, "Fine. Rating: [[7]]", {}, 0)
                status, content, headers, delay = step
                time.sleep(delay)
                if status == 200:
                    payload = {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                else:
                    payload = {"error": {"message": content, "type": "test_error", "code": None}}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


def make_judge(server, **kw):
    sleeps = []
    kw = {"api_key": "sk-test", "base_url": server.base_url, "backoff": 0.01, "sleep": sleeps.append, **kw}
    return OpenAIJudge("gpt-4o-2024-08-06", **kw), sleeps


def test_template_is_foxs_verbatim():
    msg = judge_message("What is X?", "\nX is y.\n", "y, I think")
    assert msg == (
        "[Instruction]\nPlease act as an impartial judge and evaluate the quality of the response provided by small "
        "language model to a question displayed below. For this evaluation, you should primarily consider the "
        "following criteria:\naccuracy: \n    Score 1: The answer is completely unrelated to the reference.\n"
        "    Score 3: The answer has minor relevance but does not align with the reference.\n"
        "    Score 5: The answer has moderate relevance but contains inaccuracies.\n"
        "    Score 7: The answer aligns with the reference but has minor omissions.\n"
        "    Score 10: The answer is completely accurate and aligns perfectly with the reference.\n"
        "    Only respond with a numberical score\n    \n[Ground truth]\n\nX is y.\n\nRemember that the model is "
        "small and not instruction-tuned so it may output additional garbage content and have strange formatting. "
        "These should absolutely not affect your rating as long as the ground truth is included in the model's "
        "response. Only give your rating based on the relevant (if any) part of the response. Begin your "
        "evaluation by providing a short explanation. Be as objective as possible. After providing your "
        "explanation, you must rate the response on a scale of 1 to 10 by strictly following this format: "
        '"[[rating]]", for example: "Rating: [[5]]". Some bad models might give empty response in which case you '
        "should give the lowest score.\n\n[Question]\nWhat is X?\n\n[The Start of the Model's Answer]\ny, I think\n"
        "[The End of the Model's Answer]"
    )
    assert parse_rating("Good. Rating: [[10]] or [[3]]") == 10
    assert parse_rating("Rating: 8") is None and parse_rating(None) is None and parse_rating("[[ 4 ]]") is None


def test_success_sends_foxs_request(server):
    judge, sleeps = make_judge(server)
    result = judge.rate(JUDGE_QUESTION, STANDARD_NEEDLE, "eat a sandwich")
    assert (result.score, result.reply, result.error, result.attempts) == (7, "Fine. Rating: [[7]]", None, 1)
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert req["model"] == "gpt-4o-2024-08-06" and req["temperature"] == 0
    assert req["messages"] == [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": judge_message(JUDGE_QUESTION, STANDARD_NEEDLE, "eat a sandwich")},
    ]
    assert sleeps == []


def test_retries_on_429_5xx_and_timeouts(server):
    server.script = [
        (429, "slow down", {"Retry-After": "0.05"}, 0),
        (500, "boom", {}, 0),
        (503, "unavailable", {}, 0),
        (200, "late", {}, 1.0),  # longer than the client's timeout
        (200, "Accurate. [[9]]", {}, 0),
    ]
    judge, sleeps = make_judge(server, timeout=0.3)
    result = judge.rate("q", "ref", "pred")
    assert (result.score, result.attempts, result.error) == (9, 5, None)
    assert sleeps == [0.05, 0.02, 0.04, 0.08]  # Retry-After honoured, then doubling backoff


@pytest.mark.parametrize("status", [408, 409])
def test_retries_on_408_and_409(server, status):
    """Request Timeout and Conflict are transient (the OpenAI SDK retries them too): the next success counts."""
    server.script = [(status, "try again", {}, 0), (200, "Right. [[8]]", {}, 0)]
    judge, sleeps = make_judge(server)
    result = judge.rate("q", "ref", "pred")
    assert (result.score, result.reply, result.error, result.attempts) == (8, "Right. [[8]]", None, 2)
    assert len(server.requests) == 2 and sleeps == [0.01]


def test_retries_408_then_409_then_succeeds(server):
    server.script = [(408, "request timeout", {}, 0), (409, "conflict", {}, 0), (200, "[[4]]", {}, 0)]
    judge, sleeps = make_judge(server)
    result = judge.rate("q", "ref", "pred")
    assert (result.score, result.error, result.attempts) == (4, None, 3)
    assert len(server.requests) == 3 and sleeps == [0.01, 0.02]


def test_gives_up_and_records_missing(server):
    server.script = [(500, "down", {}, 0)] * 3
    judge, sleeps = make_judge(server, max_attempts=3)
    result = judge.rate("q", "ref", "pred")
    assert result.score is None and result.reply is None and result.attempts == 3
    assert "gave up after 3 attempts" in result.error and "InternalServerError" in result.error
    assert len(sleeps) == 2


def test_unparseable_reply_is_kept_as_missing(server):
    server.script = [(200, "I would say it is quite good.", {}, 0)]
    judge, _ = make_judge(server)
    result = judge.rate("q", "ref", "pred")
    assert result.score is None and result.reply == "I would say it is quite good." and result.error is None
    assert len(server.requests) == 1  # not retried


def test_client_errors_stop_the_run(server):
    server.script = [(401, "invalid api key", {}, 0)]
    judge, _ = make_judge(server)
    with pytest.raises(UserError, match="401"):
        judge.rate("q", "ref", "pred")
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        OpenAIJudge("m", env={})
    with pytest.raises(UserError, match="unknown judge"):
        OpenAIJudge.from_spec("local:llama")
    assert (
        OpenAIJudge.from_spec("openai:m", env={"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": server.base_url}).model == "m"
    )


def test_niah_run_with_judge_and_rejudge_on_resume(server, tmp_path, monkeypatch):
    adapter = NativeAdapter(load_card("fox-pro-tiny"), device="cpu")
    config = NiahConfig(mode="easy", lengths=[400], depths=[0, 50, 100], max_new_tokens=4)
    # Cell 1: fine; cell 2: unparseable; cell 3: the endpoint stays down past the last attempt.
    server.script = [(200, "[[8]]", {}, 0), (200, "no rating here", {}, 0), (502, "bad gateway", {}, 0)]
    server.script += [(502, "bad gateway", {}, 0)]
    judge, _ = make_judge(server, max_attempts=2)
    res = run_niah(adapter, config, tmp_path / "run", judge=judge, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert [r["scores"]["judge"] for r in rows] == [8, None, None]
    assert rows[1]["judge"]["reply"] == "no rating here" and rows[2]["judge"]["error"]
    assert rows[0]["judge_reference"] == STANDARD_NEEDLE and rows[0]["judge_question"] == JUDGE_QUESTION
    judged = {r["depth"]: r for r in res["records"] if r["metric"] == "judge"}
    assert judged[0]["value"] == 8 and judged[50]["n"] == 0 and res["summary"]["judge"] == "openai:gpt-4o-2024-08-06"

    # Rerun: only the failed call is judged again (no generation: the predictions are reused).
    n_requests = len(server.requests)
    monkeypatch.setattr(adapter, "generate", lambda *a, **k: pytest.fail("generated again"))
    server.script = [(200, "Now: [[6]]", {}, 0)]
    res = run_niah(adapter, config, tmp_path / "run", judge=judge, progress=False)
    assert len(server.requests) == n_requests + 1
    judged = {r["depth"]: r for r in res["records"] if r["metric"] == "judge"}
    assert judged[100]["value"] == 6 and judged[50]["n"] == 0

    # The judge from the environment, as the CLI builds it.
    other = NiahConfig(mode="standard", lengths=[400], depths=[50], max_new_tokens=4, judge="openai:judge-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    res = run_niah(NativeAdapter(load_card("fox-pro-tiny"), device="cpu"), other, tmp_path / "env", progress=False)
    assert server.requests[-1]["model"] == "judge-model" and server.requests[-1]["auth"] == "Bearer sk-env"
    assert res["summary"]["judge"] == "openai:judge-model"
