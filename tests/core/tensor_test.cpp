// Tensor basics: views share storage, conversions round-trip, errors name the op and both shapes.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"

namespace dpt {
namespace {

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::Float64);

TEST(Tensor, ReshapeOfContiguousDataIsAView) {
  Tensor x = arange(6, kF64);
  Tensor y = x.reshape({2, -1});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(y.data_ptr(), x.data_ptr());
  y.fill_(7.0);
  EXPECT_EQ(x.to_vector<double>(), std::vector<double>(6, 7.0));
}

TEST(Tensor, SliceAndRowIndexShareStorage) {
  Tensor x = arange(12, kF64).reshape({3, 4});
  Tensor rows = x.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_EQ(rows.data<double>(), x.data<double>() + 4);
  EXPECT_EQ(x[2].to_vector<double>(), (std::vector<double>{8, 9, 10, 11}));
  Tensor cols = slice(x, 1, 1, 3);  // a strided view
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.to_vector<double>(), (std::vector<double>{1, 2, 5, 6, 9, 10}));
}

TEST(Tensor, TransposeIsAStridedViewAndContiguousCopies) {
  Tensor x = arange(6, kF64).reshape({2, 3});
  Tensor t = x.transpose(0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.data_ptr(), x.data_ptr());
  EXPECT_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.data_ptr(), x.data_ptr());
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // Reshaping a strided view copies.
  EXPECT_EQ(t.reshape({6}).to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, PermuteReordersDims) {
  Tensor x = arange(24, kF64).reshape({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  // p[k, i, j] = x[i, j, k] = 12 i + 4 j + k
  auto v = p.contiguous().to_vector<double>();
  EXPECT_EQ(v[1 * 6 + 1 * 3 + 2], 12 + 8 + 1);
  EXPECT_THROW(x.permute({0, 0, 1}), Error);
}

TEST(Tensor, DTypeConversionsRoundTrip) {
  std::vector<double> values{-2.5, 0, 1, 3.25, 1024};
  Tensor x = from_vector(values, {5}, kF64);
  for (DType d : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64}) {
    Tensor back = x.to(d).to(DType::Float64);
    EXPECT_EQ(back.dtype(), DType::Float64);
    EXPECT_EQ(back.to_vector<double>(), values) << dtype_name(d);  // all exactly representable
  }
  Tensor ints = x.to(DType::Int64);
  EXPECT_EQ(ints.to_vector<int64_t>(), (std::vector<int64_t>{-2, 0, 1, 3, 1024}));
  EXPECT_EQ(ints.to(DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{-2, 0, 1, 3, 1024}));
}

TEST(Tensor, BFloat16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1).
  Tensor x = from_vector(std::vector<double>{1.0 + 1.0 / 256, 1.0 + 3.0 / 256}, {2}, kF64);
  EXPECT_EQ(x.to(DType::BFloat16).to_vector<double>(), (std::vector<double>{1.0, 1.0 + 4.0 / 256}));
}

TEST(Tensor, FillArangeAndItem) {
  EXPECT_EQ(full({2, 2}, 1.5).to_vector<float>(), std::vector<float>(4, 1.5f));
  EXPECT_EQ(arange(4, TensorOptions{}.with_dtype(DType::Int32)).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(arange(3, TensorOptions{}.with_dtype(DType::BFloat16)).to_vector<float>(), (std::vector<float>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(scalar_tensor(4.25, kF64).item(), 4.25);
  EXPECT_THROW(zeros({2}).item(), Error);
}

TEST(Tensor, CopyConvertsAndZeroFills) {
  Tensor dst = zeros({2, 3}, kF64);
  Tensor src = arange(6).reshape({3, 2}).transpose(0, 1);  // float32, strided
  dst.copy_(src);
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{0, 2, 4, 1, 3, 5}));
  dst.zero_();
  EXPECT_EQ(dst.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_THROW(dst.copy_(zeros({3, 2})), Error);
}

TEST(Tensor, StrShowsShapeDtypeAndValues) {
  Tensor x = from_vector(std::vector<float>{1, 2}, {2});
  std::string s = x.str();
  EXPECT_NE(s.find("[2]"), std::string::npos) << s;
  EXPECT_NE(s.find("float32"), std::string::npos) << s;
  EXPECT_NE(s.find("cpu"), std::string::npos) << s;
  EXPECT_NE(s.find("1, 2"), std::string::npos) << s;
}

// Runs `f` and returns the message of the dpt::Error it throws.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tensor, ShapeMismatchErrorsNameTheOpAndBothShapes) {
  std::string add_msg = error_of([] { add(zeros({2, 3}), zeros({4})); });
  EXPECT_NE(add_msg.find("add"), std::string::npos) << add_msg;
  EXPECT_NE(add_msg.find("[2, 3]"), std::string::npos) << add_msg;
  EXPECT_NE(add_msg.find("[4]"), std::string::npos) << add_msg;

  std::string mm = error_of([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  EXPECT_NE(mm.find("matmul"), std::string::npos) << mm;
  EXPECT_NE(mm.find("[2, 3]"), std::string::npos) << mm;
  EXPECT_NE(mm.find("[4, 5]"), std::string::npos) << mm;

  std::string dt = error_of([] { mul(zeros({2}), zeros({2}, kF64)); });
  EXPECT_NE(dt.find("mul"), std::string::npos) << dt;
  EXPECT_NE(dt.find("float64"), std::string::npos) << dt;

  std::string rs = error_of([] { zeros({2, 3}).reshape({4}); });
  EXPECT_NE(rs.find("[2, 3]"), std::string::npos) << rs;
  EXPECT_NE(rs.find("[4]"), std::string::npos) << rs;
}

}  // namespace
}  // namespace dpt
