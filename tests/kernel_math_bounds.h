/* The bounds KERNELS documents (the manual's table), in ulp of the result's type: the largest
   |result - exact| allowed, so a correctly rounded function has 0.5 and an exact one 0.
   {function, host f32, host f64, OpenCL f32, OpenCL f64, CUDA f32, CUDA f64}. Host: glibc;
   OpenCL: PoCL 3.1 (its CPU device); both measured by test_kernel_math. CUDA: NVIDIA's documented
   maximum error (CUDA C++ Programming Guide, "Mathematical Functions") plus the 0.5 of rounding,
   not measured here: no GPU (the fake driver runs the host's code). */
{"sqrt", 0.5, 0.5, 0.5, 0.5, 0.5, 0.5},
{"fabs", 0, 0, 0, 0, 0, 0},
{"floor", 0, 0, 0, 0, 0, 0},
{"ceil", 0, 0, 0, 0, 0, 0},
{"round", 0, 0, 0, 0, 0, 0},
{"trunc", 0, 0, 0, 0, 0, 0},
{"fmod", 0, 0, 0, 0, 0, 0},
{"fmin", 0, 0, 0, 0, 0, 0},
{"fmax", 0, 0, 0, 0, 0, 0},
{"exp", 1, 1, 1.5, 1.5, 2.5, 1.5},
{"exp2", 1, 1, 1.5, 1.5, 2.5, 1.5},
{"log", 1, 1, 1, 1, 1.5, 1.5},
{"log2", 1, 1, 1, 1, 1.5, 1.5},
{"log10", 2, 2, 1, 1, 2.5, 1.5},
{"sin", 1, 1, 2, 2, 2.5, 2.5},
{"cos", 1, 1, 2, 2, 2.5, 2.5},
{"tan", 1, 1, 4, 3, 4.5, 2.5},
{"atan", 1, 1, 1, 1, 2.5, 2.5},
{"tanh", 2, 2.5, 1.5, 1.5, 2.5, 1.5},
{"pow", 1, 1, 1.5, 1.5, 4.5, 2.5},
{"atan2", 1.5, 1, 1.5, 1.5, 3.5, 2.5},
{"hypot", 1, 1, 1, 1, 3.5, 2.5},
