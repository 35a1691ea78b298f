// Polynomial coefficient tables of the vectorizable math approximations (llvm_math.cpp), in a
// header of their own so that bench/ can evaluate the same approximations in a hand-written loop.
#pragma once

namespace cjax::cpu::math_coefficients {

// ---- polynomial coefficients (lowest degree first) ----
// Minimax (Remez) approximations of the function named, relative error unless noted; the f32 sets
// are rounded to float. "float accuracy": double coefficients for f32 ops computed in double.
// kExpS_f: (expm1(r) - r - r^2/2) / r^3; r in [-0.35, 0.35], minimax relative error 4.9e-8.
constexpr double kExpS_f[] = {0x1.5555560000000p-3, 0x1.5555160000000p-5, 0x1.11112c0000000p-7, 0x1.6d15d00000000p-10,
                              0x1.a08b3e0000000p-13};
// kExpS4_f: the same with four terms (Chebyshev fit, f32 exp): exp's relative error 2.0e-8.
constexpr double kExpS4_f[] = {0x1.5555260000000p-3, 0x1.55553e0000000p-5, 0x1.11d9480000000p-7, 0x1.6cdeea0000000p-10};
// kExpS_d: (expm1(r) - r - r^2/2) / r^3; r in [-0.35, 0.35], minimax relative error 5.2e-17.
constexpr double kExpS_d[] = {0x1.5555555555556p-3,  0x1.5555555555553p-5,  0x1.111111111091fp-7,
                              0x1.6c16c16c182d2p-10, 0x1.a01a01a8371a8p-13, 0x1.a01a019835849p-16,
                              0x1.71de0bf240c96p-19, 0x1.27e503105d072p-22, 0x1.af3cc2e5c33fap-26,
                              0x1.1f2b578431aeap-29};
// kExpS_df: (expm1(r) - r - r^2/2) / r^3, float accuracy; r in [-0.35, 0.35], minimax relative error 9.5e-10.
constexpr double kExpS_df[] = {0x1.5555555ac3aadp-3,  0x1.555555472d2c5p-5,  0x1.1110df1ab88b3p-7,
                               0x1.6c16dc262f22cp-10, 0x1.a12a0e1c07574p-13, 0x1.a086b1a59786cp-16};
// kExp2Q_f: (2^r - 1) / r; r in [-0.5, 0.5], minimax relative error 2.3e-10.
constexpr double kExp2Q_f[] = {0x1.62e4300000000p-1,  0x1.ebfbe00000000p-3,  0x1.c6b08c0000000p-5, 0x1.3b2a1c0000000p-7,
                               0x1.5d88be0000000p-10, 0x1.443f620000000p-13, 0x1.ffcbce0000000p-17};
// kExp2Q_d: (2^r - 1) / r; r in [-0.5, 0.5], minimax relative error 2.4e-19.
constexpr double kExp2Q_d[] = {0x1.62e42fefa39efp-1,  0x1.ebfbdff82c58fp-3,  0x1.c6b08d704a0c6p-5,
                               0x1.3b2ab6fba4e60p-7,  0x1.5d87fe78a3fe5p-10, 0x1.430912f87415cp-13,
                               0x1.ffcbfc6d8d374p-17, 0x1.62c0221b643cdp-20, 0x1.b524ec0c0296dp-24,
                               0x1.e4cfae518342fp-28, 0x1.e9ebc1b9c892ep-32, 0x1.c3bd679b124a1p-36};
// kLogT_f: (2 atanh(s) / s - 2) / s^2 in z = s^2; z in [0, 0.0295], minimax relative error 2.8e-7.
constexpr double kLogT_f[] = {0x1.55555c0000000p-1, 0x1.997c040000000p-2, 0x1.2eed560000000p-2};
// kLogT_d: (2 atanh(s) / s - 2) / s^2 in z = s^2; z in [0, 0.0295], minimax relative error 3.1e-18.
constexpr double kLogT_d[] = {0x1.5555555555555p-1, 0x1.9999999999a3bp-2, 0x1.24924924765d7p-2, 0x1.c71c72021a912p-3,
                              0x1.745cf8b50bec3p-3, 0x1.3b1c4605cb0a0p-3, 0x1.0fbcdc91dff5ep-3, 0x1.0c157463ab26bp-3};
// kTanhU_f: (tanh(x) - x) / x^3 in z = x^2; z in [0, 0.3025], minimax relative error 4.0e-8.
constexpr double kTanhU_f[] = {-0x1.5555540000000p-2, 0x1.110fea0000000p-3, -0x1.b9a04e0000000p-5, 0x1.5d22700000000p-6,
                               -0x1.b137be0000000p-8};
// kTanhU_d: (tanh(x) - x) / x^3 in z = x^2; z in [0, 0.3025], minimax relative error 2.3e-17.
constexpr double kTanhU_d[] = {-0x1.5555555555555p-2,  0x1.1111111111032p-3,  -0x1.ba1ba1b9fecc1p-5,
                               0x1.664f48771478cp-6,   -0x1.226e32f042bd0p-7, 0x1.d6d3393d96fe0p-9,
                               -0x1.7d97d06c3b8a7p-10, 0x1.34c5ae47dfdfbp-11, -0x1.ec10d048daa49p-13,
                               0x1.64fe4ca4890f4p-14,  -0x1.59aa38e7f2a39p-16};
// kErfY_df: erf(x) / x - 1 in z = x^2 (error relative to erf(x) / x), float accuracy; z in [0, 1], minimax relative
// error 1.2e-9.
constexpr double kErfY_df[] = {0x1.06eba7f245b4bp-3,  -0x1.81273de94487ep-2, 0x1.ce2cf73ef665ap-4,
                               -0x1.b7f90cfe4c81ap-6, 0x1.5405b19eb389bp-8,  -0x1.a3f6ff013c296p-11,
                               0x1.496a2ff9fd18ep-14};
// kErfY_d: erf(x) / x - 1 in z = x^2 (error relative to erf(x) / x); z in [0, 0.5625], minimax relative error 7.8e-19.
constexpr double kErfY_d[] = {0x1.06eba8214db69p-3,   -0x1.812746b0379e0p-2,  0x1.ce2f21a042470p-4,
                              -0x1.b82ce312556c8p-6,  0x1.565bcd0311811p-8,   -0x1.c02db110be5d1p-11,
                              0x1.f9a2ad775189bp-14,  -0x1.f4c5b37b0e67bp-17, 0x1.b90cc479832aep-20,
                              -0x1.5641e11ad04a8p-23, 0x1.89e443ac60407p-27};
// kErfcP_df: exp(x^2) erfc(x) in t = (x - 3) / (x + 3), float accuracy; x in [1, 11], minimax relative error 9.9e-11.
constexpr double kErfcP_df[] = {0x1.6e9827d2bc286p-3,  -0x1.4e102b9b4cd02p-2, 0x1.f6ff1fc3767c6p-3,
                                -0x1.336ffc44cb1d3p-3, 0x1.258b3575b8cf2p-4,  -0x1.8fa5b5bdc43f6p-6,
                                0x1.17aec4db1f199p-8,  0x1.7398aee13f178p-11, -0x1.34ff51bf46463p-11,
                                0x1.45b4b69db9d79p-15, 0x1.96a0e9caf6d63p-15};
// kErfcP_d: (x + 1/2) exp(x^2) erfc(x) in t = (x - 3) / (x + 3); x in [0.75, 27.3], minimax relative error 2.7e-19.
constexpr double kErfcP_d[] = {0x1.40c522d7e4987p-1,   -0x1.15c084bb9e8f3p-4,  -0x1.85a15c58aa620p-6,
                               0x1.098366a5b46f6p-4,   -0x1.e88b803a486e9p-5,  0x1.17ca2877ef961p-5,
                               -0x1.8574c40c2860fp-7,  0x1.4b884e48f9cabp-10,  0x1.ef1bdd9a6c3f4p-11,
                               -0x1.98db52351ef97p-12, -0x1.b9129f963a22ep-15, 0x1.065a5fe5d0172p-14,
                               0x1.4c320a523c8f6p-19,  -0x1.51427b42b44b3p-17, -0x1.897e357a7cd0dp-22,
                               0x1.d2d30fc87f68ep-20,  0x1.7febd7432e1eap-23,  -0x1.517b6ee3baa55p-22,
                               -0x1.2638ea9de8b5ep-24, 0x1.f0ed884d3e8c4p-25,  0x1.087558762f33fp-26,
                               -0x1.4eb09438487e3p-27};
// kSinS_df: (sin(r) - r) / r^3 in z = r^2, float accuracy; r in [0, pi/4], minimax relative error 1.7e-10.
constexpr double kSinS_df[] = {-0x1.555555545a810p-3, 0x1.11110de8a17d5p-7, -0x1.a013a0623aaafp-13,
                               0x1.6dbc0e4c98873p-19};
// kCosC_df: (cos(r) - 1 + r^2/2) / r^4 in z = r^2, float accuracy; r in [0, pi/4], minimax relative error 5.7e-11.
constexpr double kCosC_df[] = {0x1.555555550208ap-5, -0x1.6c16bf520025cp-10, 0x1.a015c145bd8cap-16,
                               -0x1.252369c6ceefap-22};
// kAtanA_f: (atan(t) - t) / t^3 in z = t^2; t in [0, tan(pi/8)], minimax relative error 4.6e-8.
constexpr double kAtanA_f[] = {-0x1.5555540000000p-2, 0x1.9997380000000p-3, -0x1.2421060000000p-3, 0x1.b81f060000000p-4,
                               -0x1.086fca0000000p-4};
// kAtanA_d: (atan(t) - t) / t^3 in z = t^2; t in [0, tan(pi/8)], minimax relative error 9.3e-17.
constexpr double kAtanA_d[] = {-0x1.5555555555555p-2, 0x1.9999999999369p-3, -0x1.24924924377c5p-3, 0x1.c71c71860544cp-4,
                               -0x1.745d0b45c726dp-4, 0x1.3b126576f2226p-4, -0x1.10fa9791e84ddp-4, 0x1.dfe84d2820384p-5,
                               -0x1.a0a375abe115bp-5, 0x1.417d6ac3a7fd2p-5, -0x1.3a6f13af6441ap-6};
// kAsinP_f: (asin(x) - x) / x^3 in z = x^2; x in [0, 0.5], minimax relative error 2.1e-8.
constexpr double kAsinP_f[] = {0x1.5555540000000p-3, 0x1.33343c0000000p-4, 0x1.6d59020000000p-5,
                               0x1.fdcb1e0000000p-6, 0x1.17dda00000000p-6, 0x1.14e32a0000000p-5};
// kAsinP_d: (asin(x) - x) / x^3 in z = x^2; x in [0, 0.5], minimax relative error 7.5e-17.
constexpr double kAsinP_d[] = {0x1.5555555555556p-3, 0x1.3333333332e84p-4, 0x1.6db6db6e387fcp-5, 0x1.f1c71c19d5623p-6,
                               0x1.6e8bb25dde660p-6, 0x1.1c4d286b71aa7p-6, 0x1.c9d08bcb2646ep-7, 0x1.7817d88f1c0bfp-7,
                               0x1.529e1a589e5f5p-7, 0x1.62a49b8154330p-8, 0x1.1f1b1c513e388p-6, -0x1.eccfc910408a9p-7,
                               0x1.d93915c9ea770p-6};
// kLogT_dd: (2 atanh(s) / s - 2) / s^2 in z = s^2 for the double-double log of f64 pow; z in [0, 0.00121],
// minimax relative error 1.2e-18.
constexpr double kLogT_dd[] = {0x1.5555555555555p-1, 0x1.9999999999754p-2, 0x1.249249283d243p-2, 0x1.c71c2f7e7bd3fp-3,
                               0x1.755181bd14802p-3};
// Centers c = 2^(j/5), j = -2..2, of the f64 pow log reduction, and log(c) as double-double.
constexpr double kPowC[] = {0x1.8406003b2ae5cp-1, 0x1.bdb8cdadbe120p-1, 1, 0x1.2611186bae675p+0, 0x1.51cb453b9536cp+0};
constexpr double kPowLogCHi[] = {-0x1.1be9bff2e94c0p-2, -0x1.1be9bff2e94c0p-3, 0, 0x1.1be9bff2e94c2p-3,
                                 0x1.1be9bff2e94bfp-2};
constexpr double kPowLogCLo[] = {-0x1.e7bb48208181bp-56, 0x1.1efb41b1f6fd6p-60, 0, 0x1.ddb4f794c9808p-58,
                                 -0x1.d1be8eaccd167p-56};
// The boundaries 2^((2j+1)/10) between the centers.
constexpr double kPowBounds[] = {0x1.9fdf8bcce533dp-1, 0x1.ddb680117ab12p-1, 0x1.125fbee250664p+0,
                                 0x1.3b2c47bff8329p+0};
// kCbrtG: cbrt(m), the start of the Halley iteration; m in [1, 2], minimax relative error 6.4e-4.
constexpr double kCbrtG[] = {0x1.3e3701dff553dp-1, 0x1.c1fd1a85c46acp-2, -0x1.ee2317f05191cp-5};

}  // namespace cjax::cpu::math_coefficients
