from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_SERVING: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
    WORKER_STATE_PAUSED: _ClassVar[WorkerState]
    WORKER_STATE_LOADING: _ClassVar[WorkerState]
    WORKER_STATE_FAILED: _ClassVar[WorkerState]

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_WAIT: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_SERVING: WorkerState
WORKER_STATE_DRAINING: WorkerState
WORKER_STATE_PAUSED: WorkerState
WORKER_STATE_LOADING: WorkerState
WORKER_STATE_FAILED: WorkerState
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_WAIT: PauseMode
PAUSE_MODE_ABORT: PauseMode

class WorkerStatus(_message.Message):
    __slots__ = ("model_name", "role", "weights_version", "state", "admission_open", "in_flight", "num_running", "num_waiting", "kv_usage", "num_blocks", "num_free_blocks", "block_size", "num_preemptions")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_OPEN_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    role: str
    weights_version: str
    state: WorkerState
    admission_open: bool
    in_flight: int
    num_running: int
    num_waiting: int
    kv_usage: float
    num_blocks: int
    num_free_blocks: int
    block_size: int
    num_preemptions: int
    def __init__(self, model_name: _Optional[str] = ..., role: _Optional[str] = ..., weights_version: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., admission_open: _Optional[bool] = ..., in_flight: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., num_preemptions: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchStatusRequest(_message.Message):
    __slots__ = ("interval_seconds",)
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    interval_seconds: float
    def __init__(self, interval_seconds: _Optional[float] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("mode", "timeout_seconds")
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    mode: PauseMode
    timeout_seconds: float
    def __init__(self, mode: _Optional[_Union[PauseMode, str]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("source", "version", "kv", "rebuild_from")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    REBUILD_FROM_FIELD_NUMBER: _ClassVar[int]
    source: str
    version: str
    kv: str
    rebuild_from: str
    def __init__(self, source: _Optional[str] = ..., version: _Optional[str] = ..., kv: _Optional[str] = ..., rebuild_from: _Optional[str] = ...) -> None: ...

class ReceiveWeightsRequest(_message.Message):
    __slots__ = ("update_id", "store_host", "store_port", "rank", "world_size", "version", "timeout_seconds")
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    store_host: str
    store_port: int
    rank: int
    world_size: int
    version: str
    timeout_seconds: float
    def __init__(self, update_id: _Optional[str] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., version: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class SendWeightsRequest(_message.Message):
    __slots__ = ("update_id", "store_host", "store_port", "version", "timeout_seconds")
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    update_id: str
    store_host: str
    store_port: int
    version: str
    timeout_seconds: float
    def __init__(self, update_id: _Optional[str] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., version: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...
