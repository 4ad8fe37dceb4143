// The one list of ops. The tape, backward, the test tables (and the device
// engine) iterate it; a new op is one tag plus one entry here.
#pragma once

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>
#include <cstdint>
#include <string_view>

#include "grad/tags/attention.hpp"
#include "grad/tags/cross_entropy.hpp"
#include "grad/tags/dropout.hpp"
#include "grad/tags/elementwise.hpp"
#include "grad/tags/embedding.hpp"
#include "grad/tags/gated.hpp"
#include "grad/tags/heads.hpp"
#include "grad/tags/layer_norm.hpp"
#include "grad/tags/layout.hpp"
#include "grad/tags/linalg.hpp"
#include "grad/tags/linear_cross_entropy.hpp"
#include "grad/tags/log_softmax.hpp"
#include "grad/tags/piecewise.hpp"
#include "grad/tags/power.hpp"
#include "grad/tags/reduce.hpp"
#include "grad/tags/reduce_axis.hpp"
#include "grad/tags/rms_norm.hpp"
#include "grad/tags/row_sum.hpp"
#include "grad/tags/softmax.hpp"
#include "grad/tags/unary.hpp"

namespace grad {

// Leaves: values copied in by Tape::param / Tape::constant.
struct Param {
  static constexpr std::string_view name = "param";
  static constexpr int arity = 0;
};
struct Const {
  static constexpr std::string_view name = "const";
  static constexpr int arity = 0;
};

using OpList = boost::mp11::mp_list<Param, Const,                                           //
                                    Add, Sub, Mul, Div, Neg,                                //
                                    AddScalar, MulScalar, DivScalar, ScalarSub, ScalarDiv,  //
                                    Relu, Sigmoid, Tanh, Gelu, Exp, Log, Sqrt,              //
                                    Sum, Mean, Matmul, Bmm, Transpose,                      //
                                    Reshape, Slice, Concat, Softmax,                        //
                                    RowSum,                                                 //
                                    Embedding, CrossEntropy,                                //
                                    Abs, ClampMin, ClampMax, PowScalar, Pow, Maximum, Minimum, WhereTrue, WhereFalse,
                                    AxisMax, AxisMin, LogSoftmax,                           //
                                    Dropout,                                                //
                                    CausalAttentionProbs, AttentionContext,                 //
                                    MatmulNt, RmsNorm, LayerNorm,                           //
                                    LinearCrossEntropy,                                     //
                                    HeadsMajor, RowsMajor, RopeHeadsMajor,                 //
                                    AddScaled, SiluMul>;

inline constexpr std::size_t op_count = boost::mp11::mp_size<OpList>::value;
static_assert(op_count <= 256, "op codes are one byte");

template <class Op>
inline constexpr std::uint8_t op_code = static_cast<std::uint8_t>(boost::mp11::mp_find<OpList, Op>::value);

// Turns a runtime op code back into its tag: f(Op{}) for the op with that code.
template <class F>
GRAD_HD constexpr decltype(auto) with_op(std::uint8_t code, F&& f) {
  return boost::mp11::mp_with_index<op_count>(
      code, [&](auto index) -> decltype(auto) { return f(boost::mp11::mp_at_c<OpList, decltype(index)::value>{}); });
}

inline std::string_view op_name(std::uint8_t code) {
  return with_op(code, [](auto op) { return decltype(op)::name; });
}

}  // namespace grad
