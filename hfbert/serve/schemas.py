"""The JSON of every route, as pydantic models: TEI's request bodies (text-embeddings-inference's
`router/src/http/types.rs`), OpenAI's `/v1/embeddings` and the Jina/Cohere rerank body.

Types are strict (a number is not a text, a string is not a boolean), so a wrong type is a 422 naming the field,
never a silent conversion. Unknown fields are ignored, as TEI's serde structs ignore them. Limits that depend on the
server (inputs per request, the model's length) are checked in `app.py`, which knows them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

Dimensions = Annotated[StrictInt, Field(ge=1)]
# TEI's `EmbeddingInput` (and OpenAI's `input`): a text, a list of token ids, or a list of texts and lists of ids.
# One list of ints is one input; `app.parse_inputs` tells the forms apart and names a stray id in a list of texts.
Inputs = StrictStr | list[StrictStr | StrictInt | list[StrictInt]]
Direction = Literal["left", "right", "Left", "Right"]


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class EmbedRequest(Request):
    """`POST /embed`. `normalize` defaults to true, as TEI's."""

    inputs: Inputs
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    prompt_name: StrictStr | None = None
    normalize: StrictBool = True
    dimensions: Dimensions | None = None


class EmbedAllRequest(Request):
    """`POST /embed_all`: each input's per-token vectors (the encoder's last hidden state)."""

    inputs: Inputs
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    prompt_name: StrictStr | None = None


class EmbedSparseRequest(Request):
    """`POST /embed_sparse`."""

    inputs: Inputs
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    prompt_name: StrictStr | None = None


class EmbedMultiRequest(Request):
    """`POST /embed_multi` (bge-m3): any of its three outputs of each input, from one forward pass."""

    inputs: Inputs
    outputs: list[Literal["dense", "sparse", "colbert"]] = ["dense", "sparse", "colbert"]
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    normalize: StrictBool = True


class RerankRequest(Request):
    """`POST /rerank`. `raw_scores` false: a one-label model's score is its sigmoid, several labels' a softmax."""

    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    raw_scores: StrictBool = False
    return_text: StrictBool = False


class PredictRequest(Request):
    """`POST /predict`: `inputs` one text, one pair `[first, second]`, or a batch `[[first, second], ...]`."""

    inputs: StrictStr | list[StrictStr] | list[list[StrictStr]]
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"
    raw_scores: StrictBool = False


class TokenizeRequest(Request):
    """`POST /tokenize`."""

    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class DecodeRequest(Request):
    """`POST /decode`: `ids` one sequence or a batch of them."""

    ids: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: StrictBool = True


class OpenAIEmbeddingRequest(Request):
    """`POST /v1/embeddings`, as OpenAI's: `input` one text, a list of token ids, or a list of texts or of lists of
    ids; vectors are unit length. `prompt_name` is hfbert's (as on `/embed`; the openai client sends it in
    `extra_body`)."""

    input: Inputs
    model: StrictStr | None = None
    user: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    prompt_name: StrictStr | None = None


class Document(Request):
    """A Cohere-style document object: `{"text": ...}`."""

    text: StrictStr


class CohereRerankRequest(Request):
    """`POST /v1/rerank` and `/v2/rerank`, as Jina's and Cohere's: `documents` texts (or `{"text"}` objects),
    the best `top_n` first."""

    query: StrictStr
    documents: list[StrictStr | Document]
    model: StrictStr | None = None
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool = False
