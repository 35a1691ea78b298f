// The umbrella header of cjax: JAX for C++.
#pragma once
#include "cjax/array.h"
#include "cjax/device.h"
#include "cjax/dtype.h"
#include "cjax/errors.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "cjax/io.h"
#include "cjax/nn.h"
#include "cjax/random.h"
#include "cjax/tree.h"
#include "cjax/make_jaxpr.h"
