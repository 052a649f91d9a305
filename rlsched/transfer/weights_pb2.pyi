from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ManifestRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "start", "end")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    start: int
    end: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("version", "nbytes", "sha256", "chunk_bytes", "chunk_xxh3", "tensors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_XXH3_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    version: int
    nbytes: int
    sha256: str
    chunk_bytes: int
    chunk_xxh3: _containers.RepeatedScalarFieldContainer[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, version: _Optional[int] = ..., nbytes: _Optional[int] = ..., sha256: _Optional[str] = ..., chunk_bytes: _Optional[int] = ..., chunk_xxh3: _Optional[_Iterable[int]] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("version", "offset", "receiver", "ingress_bps")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    INGRESS_BPS_FIELD_NUMBER: _ClassVar[int]
    version: int
    offset: int
    receiver: str
    ingress_bps: float
    def __init__(self, version: _Optional[int] = ..., offset: _Optional[int] = ..., receiver: _Optional[str] = ..., ingress_bps: _Optional[float] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class DataTicket(_message.Message):
    __slots__ = ("host", "port", "token")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    token: bytes
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...
