"""A stand-in Triton LLM model behind the real KServe v2 gRPC service, with known timing.

A grpcio server implements ``inference.GRPCInferenceService`` with ``tritonclient``'s generated
servicer: ``ModelInfer`` (unary) and ``ModelStreamInfer`` (bidirectional streaming, as Triton
serves decoupled models such as its vLLM and TensorRT-LLM backends). Requests carry what those
backends take — a ``text_input`` BYTES tensor, ``max_tokens``, and the vLLM backend's
``return_num_input_tokens`` / ``return_num_output_tokens`` / ``return_finish_reason`` flags — and
responses what they send: ``text_output`` (one token per streamed response), the counts and the
finish reason when asked, and an empty final response flagged ``triton_final_response`` when the
client asked for one (``enable_empty_final_response``).

A streamed token's first response comes ``--first-token-ms`` after the request, then one every
``--token-ms``; ``max_tokens`` of them (default ``--tokens``). The unary call answers with all of
them at once after the same total time. Input tokens it reports: the prompt's characters / 4,
rounded up. A model named ``*-fails`` streams three tokens, then a response with an
``error_message``, and ends that request there.

Writes the port it listens on (loopback, chosen by the kernel) to PORT_FILE once ready.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

MODEL_VERSION = "3"
FAILING_AFTER = 3


def _inputs(request: service_pb2.ModelInferRequest) -> dict[str, np.ndarray]:
    """The request's tensors, as tritonclient sends them (raw contents, one per input)."""
    found: dict[str, np.ndarray] = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=False):
        if tensor.datatype == "BYTES":
            found[tensor.name] = deserialize_bytes_tensor(raw)
        elif tensor.datatype == "BOOL":
            found[tensor.name] = np.frombuffer(raw, dtype=bool)
        elif tensor.datatype == "INT32":
            found[tensor.name] = np.frombuffer(raw, dtype=np.int32)
    return found


def _response(
    request: service_pb2.ModelInferRequest, text: str | None, outputs: dict[str, np.ndarray], final: bool = False
) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version=MODEL_VERSION, id=request.id)
    if text is not None:
        outputs = {"text_output": np.array([text.encode()], dtype=np.object_), **outputs}
    for name, values in outputs.items():
        tensor = response.outputs.add(name=name, shape=list(values.shape))
        if values.dtype == np.object_:
            tensor.datatype = "BYTES"
            response.raw_output_contents.append(serialize_byte_tensor(values).item())
        else:
            tensor.datatype = "UINT32"
            response.raw_output_contents.append(values.astype("<u4").tobytes())
    if final:
        response.parameters["triton_final_response"].bool_param = True
    return response


class TritonLLM(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, first_token_s: float, token_s: float, tokens: int) -> None:
        self.first_token_s, self.token_s, self.tokens = first_token_s, token_s, tokens

    def _plan(self, request: service_pb2.ModelInferRequest) -> tuple[dict[str, np.ndarray], int, int]:
        inputs = _inputs(request)
        prompt = b"".join(inputs["text_input"]).decode() if "text_input" in inputs else ""
        tokens = int(inputs["max_tokens"][0]) if "max_tokens" in inputs else self.tokens
        return inputs, tokens, max(1, -(-len(prompt) // 4))

    @staticmethod
    def _counts(inputs: dict[str, np.ndarray], prompt_tokens: int, output_tokens: int, last: bool) -> dict:
        outputs: dict[str, np.ndarray] = {}
        if "return_num_input_tokens" in inputs and inputs["return_num_input_tokens"][0]:
            outputs["num_input_tokens"] = np.array([prompt_tokens], dtype=np.uint32)
        if "return_num_output_tokens" in inputs and inputs["return_num_output_tokens"][0]:
            outputs["num_output_tokens"] = np.array([output_tokens], dtype=np.uint32)
        if last and "return_finish_reason" in inputs and inputs["return_finish_reason"][0]:
            outputs["finish_reason"] = np.array([b"length"], dtype=np.object_)
        return outputs

    def ModelInfer(  # noqa: N802 (the service's method name)
        self, request: service_pb2.ModelInferRequest, context: grpc.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        inputs, tokens, prompt_tokens = self._plan(request)
        time.sleep(self.first_token_s + (tokens - 1) * self.token_s)
        text = "".join(f"t{i} " for i in range(tokens))
        return _response(request, text, self._counts(inputs, prompt_tokens, tokens, last=True))

    def ModelStreamInfer(  # noqa: N802
        self, request_iterator: Iterator[service_pb2.ModelInferRequest], context: grpc.ServicerContext
    ) -> Iterator[service_pb2.ModelStreamInferResponse]:
        for request in request_iterator:
            inputs, tokens, prompt_tokens = self._plan(request)
            fails = request.model_name.endswith("-fails")
            started = time.monotonic()
            for i in range(tokens):
                time.sleep(max(0.0, started + self.first_token_s + i * self.token_s - time.monotonic()))
                if fails and i == FAILING_AFTER:
                    yield service_pb2.ModelStreamInferResponse(error_message="model crashed: out of KV cache blocks")
                    break
                counts = self._counts(inputs, prompt_tokens, 1, last=i == tokens - 1)
                yield service_pb2.ModelStreamInferResponse(infer_response=_response(request, f"t{i} ", counts))
            else:
                final = request.parameters.get("triton_enable_empty_final_response")
                if final is not None and final.bool_param:
                    yield service_pb2.ModelStreamInferResponse(infer_response=_response(request, None, {}, final=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port_file", nargs="?", help="write the chosen port here once listening")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--first-token-ms", type=float, default=300)
    parser.add_argument("--token-ms", type=float, default=40)
    parser.add_argument("--tokens", type=int, default=25)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    llm = TritonLLM(args.first_token_ms / 1e3, args.token_ms / 1e3, args.tokens)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(llm, server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    if args.port_file:
        Path(args.port_file).write_text(str(port))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop(grace=None)


if __name__ == "__main__":
    main()
