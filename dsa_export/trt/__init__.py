"""TensorRT-family backends. Nothing here imports TensorRT until a loader is called."""
