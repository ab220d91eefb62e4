// Compiles the shared precompiled header (torch/script.h) once; other targets reuse it.
